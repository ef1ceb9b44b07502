"""Acceptance checks run against a deployed bundle: the dev stack of `make run`,
the staging box, or any staging host, through its public addresses.

    pytest tests/acceptance --decks-url https://decks.staging.example --insecure
    pytest tests/acceptance --decks-url http://127.0.0.1:8080 --decks-host decks.localhost

Without a URL for a service, the checks stand up their own target first: the
service under gunicorn with the sample deck, behind a real nginx.
"""
import shutil
from pathlib import Path

import pytest
import requests

from devtools import nginx, services

ROOT = Path(__file__).resolve().parents[2]


class Target:
    """A service's public address; every request carries the Host header if set."""

    def __init__(self, url, host=None, verify=True):
        self.url, self.host, self.verify = url.rstrip("/"), host, verify

    def request(self, method, path, **kwargs):
        headers = {**({"Host": self.host} if self.host else {}), **kwargs.pop("headers", {})}
        kwargs.setdefault("timeout", 30)
        return requests.request(method, self.url + path, headers=headers, verify=self.verify, **kwargs)

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path, **kwargs):
        return self.request("POST", path, **kwargs)


def _local_decks(tmp_path_factory):
    data = tmp_path_factory.mktemp("acceptance-decks")
    shutil.copytree(ROOT / "samples/decks/welcome", data / "sources/welcome")
    service = services.start("decks", data)
    body = {"id": "welcome", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=30).raise_for_status()
    proxy = nginx.start(tmp_path_factory.mktemp("acceptance-nginx"), None, {"decks": f"127.0.0.1:{service.port}"})
    return service, proxy


@pytest.fixture(scope="session")
def decks(request, tmp_path_factory):
    url = request.config.getoption("--decks-url")
    if url:
        yield Target(url, request.config.getoption("--decks-host"), not request.config.getoption("--insecure"))
        return
    service, proxy = _local_decks(tmp_path_factory)
    try:
        yield Target(proxy.url, proxy.host("decks"))
    finally:
        proxy.stop()
        service.stop()
