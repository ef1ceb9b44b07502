"""Acceptance checks' targets: a service's public address (`Target`), from the
command-line options or stood up locally behind a real nginx (`target_for`)."""

import contextlib
import http.cookiejar
import shutil

import requests

from app import registry
from app.audio.seed import seed
from devtools import nginx, services
from tests.support.shared import ROOT

# The services the acceptance options name (--<name>-url, --<name>-host: tests/conftest.py).
ACCEPTANCE_SERVICES = registry.NAMES


class _ServerNameAdapter(requests.adapters.HTTPAdapter):
    """TLS to an address with the server name of `host` (SNI), as a browser would send
    for that host: nginx picks the site by it (and refuses a handshake without one)."""

    def __init__(self, host):
        self.server_name = host.split(":")[0]
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["server_hostname"] = self.server_name
        super().init_poolmanager(*args, **kwargs)


class Target:
    """A service's public address; every request carries the Host header if set
    (and, over https, that host as the TLS server name)."""

    def __init__(self, url, host=None, verify=True):
        self.url, self.host, self.verify = url.rstrip("/"), host, verify
        self.http = requests.Session()
        # Stateless like requests.request: no cookie is kept from one request to the next.
        self.http.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        if host and self.url.startswith("https://"):
            self.http.mount("https://", _ServerNameAdapter(host))

    def request(self, method, path, **kwargs):
        headers = {**({"Host": self.host} if self.host else {}), **kwargs.pop("headers", {})}
        kwargs.setdefault("timeout", 30)
        return self.http.request(method, self.url + path, headers=headers, verify=self.verify, **kwargs)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, **kwargs):
        return self.request("POST", path, **kwargs)

    def delete(self, path, **kwargs):
        return self.request("DELETE", path, **kwargs)


def _seed_decks(service):
    shutil.copytree(ROOT / "samples/decks/welcome", service.data_dir / "sources/welcome")
    body = {"id": "welcome", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=30).raise_for_status()


def _nothing(_):
    pass


def _wizard_environment(stack):
    """A local OpenAI-compatible provider (the real one is outside this machine), so
    that the generation checks run; the test identity stays off, as in production."""
    from devtools.fake_providers import FakeProviders

    fake = stack.enter_context(FakeProviders(host="127.0.0.1"))
    return {
        "WIZ_AI_BASE_URL": fake.base_url(),
        "WIZ_TEXT_MODEL": "fake-valid-json",
        "WIZ_IMAGE_MODEL": "fake-webp",
        "WIZ_AI_PROVIDER": "local-fake",
    }


# name: (prepare DATA_DIR before the start, seed the running service, environment:
# a dict, or a function of an ExitStack that starts what the service needs)
LOCAL = {
    "decks": (_nothing, _seed_decks, {}),
    "audio": (
        lambda data_dir: seed(str(data_dir / "soundlib")),
        _nothing,
        {"AUDIO_PUBLIC_ORIGIN": "https://audio.acceptance.example"},
    ),
    "workspace": (_nothing, _nothing, {}),
    "wizard": (_nothing, _nothing, _wizard_environment),
    # A password no check knows: the checks are the ones an anonymous client can make.
    "notebook": (_nothing, _nothing, {"NOTEBOOK_PASSWORD": "acceptance-unknown-password"}),
}


def target_for(request, tmp_path_factory, name):
    """The service's public address from the options, or a local stack: the service
    (seeded as `make run` seeds it) behind a real nginx."""
    url = request.config.getoption(f"--{name}-url")
    if url:
        verify = request.config.getoption("--ca-file") or not request.config.getoption("--insecure")
        yield Target(url, request.config.getoption(f"--{name}-host"), verify)
        return
    prepare, seeder, env = LOCAL[name]
    data_dir = tmp_path_factory.mktemp(f"acceptance-{name}")
    prepare(data_dir)
    with contextlib.ExitStack() as stack:
        service = services.start(name, data_dir, env=env(stack) if callable(env) else env)
        stack.callback(service.stop)
        seeder(service)
        proxy = nginx.start(
            tmp_path_factory.mktemp(f"acceptance-{name}-nginx"),
            None,
            {name: f"127.0.0.1:{service.port}"},
            variables={"wizard_uploads_dir": str(data_dir / "uploads"), "wizard_lists_dir": str(data_dir / "lists")},
        )
        stack.callback(proxy.stop)
        yield Target(proxy.url, proxy.host(name))
