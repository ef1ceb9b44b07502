"""The staging box: a Debian 12 root booted with systemd (systemd-nspawn --boot), provisioned
by the real ops/bootstrap.sh + ansible-pull from a git copy of this working tree, and checked
from outside through its nginx on loopback ports chosen for the run (devtools/staging.py).

The box shares the host's network namespace; everything in it listens on 127.0.0.1 only.
Tests run in file order on one box (module scope): each leaves the box as it found it.
"""

import contextlib
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from app import registry
from devtools import staging
from devtools.acme_server import AcmeServer
from devtools.fake_providers import FakeProviders
from devtools.load_loop import LoadLoop, p99
from devtools.oidc_provider import sign_in
from devtools.services import free_port
from devtools.waiting import wait_for
from tests.support.ops import ServerName, recap, site_session

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "staging.test"
USER, PASSWORD = "alice", "staging-" + uuid.uuid4().hex
ACME_CA = "/etc/bundle/acme-ca.pem"  # in the box: what certbot trusts to reach pebble
# In the box: certbot's DNS-01 hook, which sets the TXT records in pebble's DNS (challtestsrv).
DNS_HOOK = "/usr/local/sbin/bundle-test-dns-hook"
APPS_HOST = f"*.apps.{DOMAIN}"
APP_HOST = f"code--main--dev--{USER}.apps.{DOMAIN}"  # one app's host under the wildcard


class Staging:
    def __init__(self, box, port, idp_port, services, first_pull, acme, acme_root):
        self.box, self.port, self.idp_port = box, port, idp_port
        self.services, self.first_pull = services, first_pull
        self.acme, self.acme_root = acme, acme_root  # pebble, and a file with the root it issues under
        self.base = f"https://127.0.0.1:{port}"
        self.issuer = f"http://127.0.0.1:{idp_port}"

    def host(self, service):
        return f"{service}.{DOMAIN}"

    def client(self, service):
        return site_session(self.host(service), self.base, verify=str(self.acme_root))  # pebble's certificate

    def open_client(self, service):
        """A client of `service` through the box's nginx, and its base URL (devtools.load_loop)."""
        return self.client(service), self.base

    def credentials(self):
        secrets = json.loads(self.box.run("cat", "/etc/bundle/secrets.json").stdout)
        return {**secrets, "workspace_owner_email": f"admin@{DOMAIN}"}

    def main_pid(self, service):
        return self.systemctl("show", "-p", "MainPID", "--value", f"bundle@{service}.service")

    def get(self, service, path, **kwargs):
        kwargs.setdefault("timeout", 10)
        return self.client(service).get(self.base + path, **kwargs)

    def pull(self):
        """ansible-pull again, as an admin re-provisions (bootstrap.sh with the kept settings)."""
        return self.box.run("bash", "/root/bootstrap.sh", timeout=900).stdout

    def systemctl(self, *args, check=True):
        return self.box.run("systemctl", *args, check=check, timeout=60).stdout.strip()

    def wait_active(self, unit, timeout=20):
        """Polls until `unit` is active (a unit may still be starting when the play ends);
        fails with its status and journal otherwise."""
        deadline = time.monotonic() + timeout
        while (state := self.systemctl("is-active", unit, check=False)) != "active":
            if time.monotonic() > deadline:
                status = self.box.run(
                    "sh",
                    "-c",
                    f"systemctl status --no-pager {unit}; journalctl -u {unit} -n 40 --no-pager",
                    check=False,
                ).stdout
                pytest.fail(f"{unit} is {state}, not active, after {timeout} s:\n{status[-5000:]}")
            time.sleep(0.2)  # polling the unit's state, with a deadline
        # Active now, and not a unit in a crash loop caught between two restarts.
        assert self.systemctl("show", "-p", "NRestarts", "--value", unit) == "0", f"{unit} restarted by itself"


def _vars(port, service_ports, idp_port, ai_base_url, acme):
    return {
        "bundle_domain": DOMAIN,
        "bundle_https_port": port,
        "bundle_ports": service_ports,
        "nginx_listen_addresses": ["127.0.0.1"],
        # The box shares this machine's network: its exporters take free ports, not the
        # fixed ones another box or a real exporter here could hold.
        **{
            f"monitoring_{name}_port": free_port()
            for name in ("node_exporter", "nginx_exporter", "services", "stub_status")
        },
        # Certificates from pebble on this machine, whose http-01 checks come to this port.
        "nginx_http_redirect_port": acme.http_port,
        "nginx_acme_email": f"admin@{DOMAIN}",
        "nginx_acme_directory": acme.directory,
        "nginx_acme_ca_file": ACME_CA,
        # Workspace apps on their own hosts, with a wildcard certificate from pebble through
        # DNS-01 (certbot's manual hooks, as an admin's would call their DNS provider).
        "bundle_apps_host": APPS_HOST,
        "nginx_acme_dns_auth_hook": f"{DNS_HOOK} set",
        "nginx_acme_dns_cleanup_hook": f"{DNS_HOOK} clear",
        # Backups into a repository outside the box (a folder of this machine bound into it).
        "backup_repository": BACKUP_REPOSITORY,
        "identity_provider_backend": "standin",
        "identity_provider_standin_port": idp_port,
        "identity_provider_upstream": f"127.0.0.1:{idp_port}",
        "identity_provider_standin_users": [
            {"username": USER, "password": PASSWORD, "email": f"{USER}@{DOMAIN}", "groups": ["admins"]}
        ],
        # The workspace platform reaches the provider directly on loopback: the box's
        # public names resolve nowhere, and its certificate is self-signed.
        "bundle_auth_url": f"http://127.0.0.1:{idp_port}",
        "bundle_auth_request_url": f"http://127.0.0.1:{idp_port}/api/authz/auth-request",
        # The AI provider is outside this machine: a local OpenAI-compatible one on the
        # host's loopback (the box shares it), so the wizard's generation checks run.
        "services_env_extra": {
            "wizard": {
                "WIZ_AI_BASE_URL": ai_base_url,
                "WIZ_TEXT_MODEL": "fake-valid-json",
                "WIZ_IMAGE_MODEL": "fake-webp",
                "WIZ_AI_PROVIDER": "local-fake",
            }
        },
    }


BACKUP_REPOSITORY = "/srv/backup"  # in the box: a folder of this machine, as an off-host disk would be


@dataclass
class Host:
    """What provisions a box as the staging host: its settings and the servers outside
    it. A second box (the restore drill's new host) is provisioned the same way."""

    repo: Path
    bootstrap: str
    settings: dict
    acme: AcmeServer
    binds: list
    ro_binds: list

    def provision(self, box, secrets=None):
        """Settings, pebble's CA and DNS hook, then the real bootstrap.sh (ansible-pull);
        `secrets`: values the secrets file holds before the first pull (imported)."""
        box.trust_host_certificates()
        box.run(
            "sh",
            "-c",
            "install -d -m 0755 /etc/bundle && cat > /etc/bundle/vars.yml",
            input=yaml.safe_dump(self.settings),
        )
        if secrets:
            box.run("sh", "-c", "umask 077 && cat > /etc/bundle/secrets.json", input=json.dumps(secrets))
        box.run("sh", "-c", f"cat > {ACME_CA}", input=self.acme.tls_ca_file.read_text())
        box.run("sh", "-c", f"cat > {DNS_HOOK} && chmod 0755 {DNS_HOOK}", input=self.acme.dns_hook())
        box.run("sh", "-c", "cat > /root/bootstrap.sh", input=self.bootstrap)
        return box.run("bash", "/root/bootstrap.sh", "--repo", "/srv/bundle.git", "--branch", "staging", timeout=1200)


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    reason = staging.nspawn_unavailable() or AcmeServer.unavailable()
    if reason:
        pytest.skip(f"!!! STAGING BOX NOT RUN: {reason} !!!")
    root = staging.ensure_root(log=lambda line: print(line, file=sys.stderr))
    work = tmp_path_factory.mktemp("staging")
    # The working tree as it is on disk, as the branch `staging` of a bare repository.
    repo, bootstrap = staging.publish_snapshot(work)
    port, idp_port = free_port(), free_port()
    service_ports = {name: free_port() for name in registry.NAMES}
    pip_cache = staging.CACHE / "pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    offsite = work / "backup-repository"  # outlives the box: the restore drill's new box finds it
    offsite.mkdir()
    binds, ro_binds = [(pip_cache, "/root/.cache/pip"), (offsite, BACKUP_REPOSITORY)], [(repo, "/srv/bundle.git")]
    with (
        FakeProviders(host="127.0.0.1") as ai,
        AcmeServer(free_port(), work / "acme") as acme,
        contextlib.ExitStack() as boxes,
    ):
        host = Host(repo, bootstrap, _vars(port, service_ports, idp_port, ai.base_url(), acme), acme, binds, ro_binds)
        box = boxes.enter_context(staging.Box.boot(root, binds=binds, ro_binds=ro_binds))
        pulled = host.provision(box)
        enabled = box.run("sh", "-c", "ls /etc/bundle/*.env").stdout.split()
        services = sorted(Path(p).stem for p in enabled)
        acme_root = work / "acme-root.pem"
        acme_root.write_text(acme.issuing_root())
        staged = Staging(box, port, idp_port, services, pulled.stdout, acme, acme_root)
        staged.host_settings, staged.boxes, staged.root = host, boxes, root
        yield staged


def test_provisioned_services_are_active_and_their_units_verify(stage):
    assert recap(stage.first_pull)["failed"] == "0"
    assert {"workspace", "decks", "audio"} <= set(stage.services)
    units = [f"bundle@{service}.service" for service in stage.services] + ["nginx.service", "bundle-idp.service"]
    if "notebook" in stage.services:
        units.append("bundle-worker@notebook.service")
    for unit in units:
        stage.wait_active(unit)
    units = [f"bundle@{s}.service" for s in stage.services]
    verified = stage.box.run("systemd-analyze", "verify", *units, check=False)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr
    # Environment files: root-owned, group bundle may read, nobody else.
    modes = stage.box.run("stat", "-c", "%a %U %G", *[f"/etc/bundle/{s}.env" for s in stage.services]).stdout
    assert set(modes.split("\n")) - {""} == {"640 root bundle"}
    assert stage.box.run("stat", "-c", "%a %U", "/etc/bundle/secrets.json").stdout.strip() == "600 root"


def test_no_secret_is_printed_by_the_playbook(stage):
    secrets = json.loads(stage.box.run("cat", "/etc/bundle/secrets.json").stdout)
    assert secrets
    for value in secrets.values():
        assert value not in stage.first_pull


def test_the_platform_has_its_owner_from_the_secrets_file(stage):
    """Claimed at provisioning: nobody can take the platform through /setup, and the
    Owner signs in with the password of the box's secrets file."""
    first = stage.get("workspace", "/api/v2/users/first")
    assert first.status_code == 200, first.text
    claim = stage.client("workspace").post(
        stage.base + "/api/v2/users/first",
        timeout=10,
        json={"username": "mallory", "email": f"mallory@{DOMAIN}", "password": "mallory-" + uuid.uuid4().hex},
    )
    assert claim.status_code == 409, claim.text
    password = json.loads(stage.box.run("cat", "/etc/bundle/secrets.json").stdout)["workspace_owner_password"]
    http = stage.client("workspace")
    signed_in = http.post(
        stage.base + "/api/v2/users/login", timeout=30, json={"email": f"admin@{DOMAIN}", "password": password}
    )
    assert signed_in.status_code == 201, signed_in.text
    me = http.get(
        stage.base + "/api/v2/users/me",
        timeout=10,
        headers={"Workspace-Session-Token": signed_in.json()["session_token"]},
    )
    assert me.status_code == 200, me.text
    assert me.json()["username"] == "admin" and "owner" in me.json()["roles"], me.json()


def test_the_box_installs_only_what_the_services_run(stage):
    """requirements.txt and nothing of the tests' and checks' tools (requirements-dev.txt)."""
    installed = stage.box.run(
        "/opt/bundle/.venv/bin/pip", "list", "--format=freeze", "--disable-pip-version-check"
    ).stdout

    def names_in(text):
        return {
            re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
            for line in text.splitlines()
            if "==" in line and not line.startswith("#")
        }

    names, pinned = names_in(installed), names_in((ROOT / "requirements.txt").read_text())
    assert pinned <= names, f"missing in the box: {sorted(pinned - names)}"
    tools = {"pytest", "playwright", "schemathesis", "hypothesis", "ansible-lint", "ruff", "uv", "yamllint"}
    assert not names & tools, f"test tools on a production host: {sorted(names & tools)}"


def _peer_certificate(stage, name):
    """The certificate the box's nginx serves for `name`, verified against the ACME
    server's root (chain, names, dates), as ssl's getpeercert() gives it."""
    context = ssl.create_default_context(cafile=str(stage.acme_root))
    with (
        socket.create_connection(("127.0.0.1", stage.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        return tls.getpeercert()


def _served_certificate(stage, name):
    """The serial number of the certificate served for `name` (_peer_certificate)."""
    return _peer_certificate(stage, name)["serialNumber"]


def _certificate_names(stage, name):
    """The DNS names of the certificate served for `name` (_peer_certificate)."""
    return [value for kind, value in _peer_certificate(stage, name)["subjectAltName"] if kind == "DNS"]


def _assert_serves_the_acme_certificate(stage, link, lineage):
    """nginx's `link` points at certbot's `lineage`; else fail with what the pull and
    certbot said about it."""
    served = stage.box.run("readlink", link).stdout.strip()
    if served != f"/etc/letsencrypt/live/{lineage}/fullchain.pem":
        certbot = stage.box.run("tail", "-n", "80", "/var/log/letsencrypt/letsencrypt.log", check=False)
        pytest.fail(
            f"nginx serves {served} ({link}); the pull said:\n"
            + "\n".join(line for line in stage.first_pull.splitlines() if "certbot" in line)
            + "\n--- certbot's log ---\n"
            + certbot.stdout
            + certbot.stderr
        )


def test_the_certificate_comes_from_the_acme_server_for_every_host(stage):
    _assert_serves_the_acme_certificate(stage, "/etc/bundle/tls/served.crt", "bundle")
    names = [stage.host(service) for service in stage.services] + [f"auth.{DOMAIN}"]
    assert len({_served_certificate(stage, name) for name in names}) == 1  # one certificate for all
    assert stage.systemctl("is-enabled", "certbot.timer") == "enabled"


def test_the_app_hosts_have_a_wildcard_certificate_from_the_acme_server(stage):
    env = stage.box.run("cat", "/etc/bundle/workspace.env").stdout
    assert f'WORKSPACE_WILDCARD_ACCESS_URL="{APPS_HOST}:{stage.port}"' in env.splitlines()
    _assert_serves_the_acme_certificate(stage, "/etc/bundle/tls/apps-served.crt", "bundle-apps")
    # Issued by pebble (the chain verifies against its root) for the wildcard name, which
    # covers an app's host; a certificate of its own, not the services' one.
    assert _certificate_names(stage, APP_HOST) == [APPS_HOST]
    assert _served_certificate(stage, APP_HOST) != _served_certificate(stage, stage.host("workspace"))
    # nginx hands the app hosts to the platform (its answer carries the request id).
    http = requests.Session()
    http.verify, http.trust_env = str(stage.acme_root), False
    http.mount("https://", ServerName(APP_HOST))
    answer = http.get(stage.base + "/", headers={"Host": f"{APP_HOST}:{stage.port}"}, allow_redirects=False, timeout=10)
    assert answer.status_code != 421 and "X-Request-Id" in answer.headers, (answer.status_code, answer.text[:300])


def test_acceptance_suite_passes_through_the_box(stage):
    options = ["--ca-file", str(stage.acme_root)]  # the chain is verified, as a browser would
    for service in stage.services:
        options += [f"--{service}-url", stage.base, f"--{service}-host", stage.host(service)]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/acceptance", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:  # what the box's nginx and identity provider said, to tell why
        logs = stage.box.run(
            "sh",
            "-c",
            "tail -n 40 /var/log/nginx/error.log; journalctl -u bundle-idp -u 'bundle@*' -n 60 --no-pager",
            check=False,
        ).stdout
        pytest.fail(result.stdout[-6000:] + result.stderr[-2000:] + "\n--- box logs ---\n" + logs[-6000:])


def test_wizard_answers_after_a_restart(stage):
    stage.systemctl("restart", "bundle@wizard.service")
    me = stage.get("wizard", "/api/me")
    assert me.status_code == 200, me.text
    assert me.json()["username"] == "public"
    assert stage.systemctl("is-active", "bundle@wizard.service") == "active"


def _wait_healthy(stage, deadline):
    while time.monotonic() < deadline:
        try:
            if stage.get("decks", "/healthz", timeout=2).status_code == 200:
                return time.monotonic()
        except requests.RequestException:
            pass
        time.sleep(0.1)  # polling for the restart, with a deadline
    return None


def _answered_since(loop, service, count=3):
    """Until the loop's client of `service` has had `count` more answers."""
    before = loop.tallies[service].requests
    wait_for(lambda: loop.tallies[service].requests >= before + count, f"the loop to reach {service} again", 120)


@pytest.mark.parametrize("operation", ["restart", "reload"])
def test_restart_and_reload_of_every_service_fail_no_request(stage, operation):
    """Under a loop of reads and writes on every service through nginx, each service is
    restarted (or reloaded) in turn: no connection refused, no 5xx, every acknowledged
    write there after, every deck stream event and wizard row seen exactly once."""
    loop = LoadLoop(stage.open_client, stage.credentials(), services=stage.services)
    steps = []
    with loop.running():
        for service in stage.services:
            pid = stage.main_pid(service)
            started = time.monotonic()
            stage.systemctl(operation, f"bundle@{service}.service")
            steps.append(f"  systemctl {operation} bundle@{service}: {time.monotonic() - started:.1f} s")
            # A restart is a new main process; a reload keeps it (gunicorn's HUP: new workers).
            assert (stage.main_pid(service) == pid) == (operation == "reload")
            _answered_since(loop, service)
    print(f"\n{operation} under load:\n" + "\n".join(steps) + "\n" + loop.summary())
    assert loop.failures() == {}, loop.summary()
    assert loop.missing_writes() == {}
    assert loop.stream_faults() == []
    for service in stage.services:
        stage.wait_active(f"bundle@{service}.service")


def test_a_reload_of_code_that_does_not_import_keeps_the_old_workers(stage):
    """Code on disk that fails to import: `systemctl reload` fails, the journal says why,
    and the running workers go on serving (nothing was signalled)."""
    source = "/opt/bundle/app/decks/api.py"
    pid = stage.main_pid("decks")
    workers = stage.box.run("cat", f"/proc/{pid}/task/{pid}/children").stdout.split()
    stage.box.run("cp", "-p", source, "/root/api.py.kept")
    try:
        stage.box.run("sh", "-c", f"echo 'def broken(:' >> {source}")
        reloaded = stage.box.run("systemctl", "reload", "bundle@decks.service", check=False, timeout=120)
        assert reloaded.returncode != 0
        journal = []  # journald takes the command's output in on its own schedule

        def said_why():
            journal.append(stage.box.run("journalctl", "-u", "bundle@decks", "-n", "60", "--no-pager").stdout)
            return "reload refused" in journal[-1] and "SyntaxError" in journal[-1]

        wait_for(said_why, "the journal to say why the reload was refused")
        assert stage.main_pid("decks") == pid
        assert stage.box.run("cat", f"/proc/{pid}/task/{pid}/children").stdout.split() == workers
        assert stage.get("decks", "/api/decks").status_code == 200
    finally:
        stage.box.run("cp", "-p", "/root/api.py.kept", source)
    stage.systemctl("reload", "bundle@decks.service")  # the code imports again: new workers
    assert stage.box.run("cat", f"/proc/{pid}/task/{pid}/children").stdout.split() != workers


def test_a_killed_master_costs_a_wait_not_an_error(stage):
    """SIGKILL to a service's gunicorn master: systemd starts it again while its socket
    (held by bundle@decks.socket) queues the connections that arrive meanwhile. What clients
    see is printed: the longest wait, and any failure (a request in flight in a worker that
    the kill took with it)."""
    loop = LoadLoop(stage.open_client, stage.credentials(), services=["decks", "wizard"])
    restarts = int(stage.systemctl("show", "-p", "NRestarts", "--value", "bundle@decks.service"))
    with loop.running():
        pid = stage.main_pid("decks")
        killed = time.monotonic()
        stage.box.run("kill", "-KILL", pid)
        wait_for(
            lambda: (
                stage.systemctl("is-active", "bundle@decks.service", check=False) == "active"
                and stage.main_pid("decks") not in ("0", pid)
            ),
            "systemd to start the deck service again",
            timeout=60,
        )
        back = time.monotonic() - killed
        _answered_since(loop, "decks")
    print(f"\nSIGKILL of the deck service's master: active again after {back:.1f} s\n" + loop.summary())
    assert int(stage.systemctl("show", "-p", "NRestarts", "--value", "bundle@decks.service")) == restarts + 1
    assert "wizard" not in loop.failures()  # the other services never noticed
    assert loop.missing_writes() == {}
    assert loop.stream_faults() == []


def test_stop_with_a_hundred_open_streams_ends_within_twenty_seconds(stage):
    decks = stage.get("decks", "/api/decks").json()
    created = stage.client("decks").post(stage.base + "/api/sessions", json={"deck_id": decks[0]["id"]}, timeout=10)
    assert created.status_code == 201, created.text
    stream_path = f"/api/sessions/{created.json()['id']}/stream"
    opened, ended, errors = threading.Semaphore(0), [], []

    def hold():
        try:
            with stage.get("decks", stream_path, stream=True, timeout=(10, 60)) as response:
                assert response.status_code == 200
                opened.release()
                for _ in response.iter_content(None):
                    pass
            ended.append(time.monotonic())
        except Exception as error:  # reported below
            errors.append(error)
            opened.release()

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(100)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert opened.acquire(timeout=30)
    assert not errors, errors[:3]
    started = time.monotonic()
    stage.systemctl("stop", "bundle@decks.service")
    took = time.monotonic() - started
    for thread in threads:
        thread.join(30)
    stage.systemctl("start", "bundle@decks.service")
    assert took < 20, f"systemctl stop took {took:.1f} s"
    assert len(ended) == 100 and not errors
    assert _wait_healthy(stage, time.monotonic() + 15)


def test_a_renewal_by_certbots_timer_is_served_without_restarting_anything(stage):
    units = [f"bundle@{service}.service" for service in stage.services] + ["nginx.service"]
    pids = {unit: stage.systemctl("show", "-p", "MainPID", "--value", unit) for unit in units}
    before = {name: _served_certificate(stage, name) for name in (stage.host("decks"), APP_HOST)}
    # What certbot.timer starts: pebble's certificates (20 days) are inside the 30-day window.
    # Both are renewed, the app hosts' one through the DNS-01 hooks certbot kept.
    stage.systemctl("start", "certbot.service")
    try:  # nginx's new workers take the new configuration a moment after the reload returns
        for name, serial in before.items():
            wait_for(
                lambda name=name, serial=serial: _served_certificate(stage, name) != serial,
                f"the renewed certificate of {name}",
            )
    except TimeoutError:
        pytest.fail(stage.box.run("journalctl", "-u", "certbot", "-n", "30", "--no-pager").stdout)
    assert {unit: stage.systemctl("show", "-p", "MainPID", "--value", unit) for unit in units} == pids


def test_a_second_pull_changes_nothing(stage):
    output = stage.pull()
    assert recap(output)["changed"] == "0", output[-6000:]


def _oidc_sign_in(stage):
    """The whole single sign-on through the box: the platform's button, the provider's
    login form, the callback; returns the signed-in /users/me."""
    http = stage.client("workspace")
    start = http.get(
        stage.base + "/api/v2/users/oidc/callback", params={"redirect": "/"}, allow_redirects=False, timeout=10
    )
    assert start.status_code in (302, 303), start.text
    authorization = start.headers["Location"]
    assert authorization.startswith(stage.issuer + "/api/oidc/authorization?")
    provider = requests.Session()
    back = sign_in(provider, authorization, USER, PASSWORD)
    callback = f"https://{stage.host('workspace')}:{stage.port}/api/v2/users/oidc/callback"
    assert back.startswith(callback + "?"), back
    finished = http.get(
        stage.base + urlsplit(back).path + "?" + urlsplit(back).query, allow_redirects=False, timeout=30
    )
    assert finished.status_code == 303, finished.text[:500]
    me = http.get(stage.base + "/api/v2/users/me", timeout=10)
    assert me.status_code == 200, me.text
    return me.json()


def test_secret_rotation_keeps_oidc_sign_in_working(stage):
    assert _oidc_sign_in(stage)["username"] == USER
    before = stage.box.run("cat", "/etc/authelia/oidc-clients.yml").stdout
    env_before = stage.box.run("grep", "OIDC_CLIENT_SECRET", "/etc/bundle/workspace.env").stdout
    workspace_pid = stage.systemctl("show", "-p", "MainPID", "--value", "bundle@workspace.service")
    decks_pid = stage.systemctl("show", "-p", "MainPID", "--value", "bundle@decks.service")
    rotated = stage.box.run(
        "ansible-playbook",
        "-i",
        "localhost,",
        "-e",
        "@/etc/bundle/vars.yml",
        "/var/lib/bundle-pull/ops/rotate-oidc-secret.yml",
        timeout=900,
    )
    assert recap(rotated.stdout)["failed"] == "0"
    assert stage.box.run("cat", "/etc/authelia/oidc-clients.yml").stdout != before
    assert stage.box.run("grep", "OIDC_CLIENT_SECRET", "/etc/bundle/workspace.env").stdout != env_before
    # Both restarted by the handlers, and only the services concerned.
    assert stage.systemctl("show", "-p", "MainPID", "--value", "bundle@workspace.service") != workspace_pid
    assert stage.systemctl("show", "-p", "MainPID", "--value", "bundle@decks.service") == decks_pid
    secrets = json.loads(stage.box.run("cat", "/etc/bundle/secrets.json").stdout)
    assert secrets["workspace_oidc_client_secret"] not in rotated.stdout
    assert _oidc_sign_in(stage)["username"] == USER


def test_nginx_sends_the_published_anonymous_view_itself(stage):
    # The service (its user, UMask 0027) writes lists/public in the folder nginx's group
    # reads: after the first anonymous read, nginx answers alone (its own ETag, the
    # file's time and size), and a write is in the very next read.
    stage.get("wizard", "/api/collections/blueprints")
    published = stage.get("wizard", "/api/collections/blueprints")
    assert published.status_code == 200, published.text
    assert re.fullmatch(r'"[0-9a-f]+-[0-9a-f]+"', published.headers.get("ETag", "")), published.headers
    made = stage.client("wizard").post(
        stage.base + "/api/collections/blueprints",
        timeout=10,
        json={"title": "published on the box", "is_public": True},
    )
    assert made.status_code == 201, made.text
    fresh = stage.get("wizard", "/api/collections/blueprints")
    assert made.json()["id"] in {row["id"] for row in fresh.json()}
    assert fresh.headers["ETag"] != published.headers["ETag"]


def _serving(stage):
    """Every service answers its health route through the box's nginx."""
    try:
        return all(stage.get(name, registry.BY_NAME[name].health).status_code == 200 for name in stage.services)
    except requests.RequestException:
        return False


def _notebook(stage):
    http = stage.client("notebook")
    http.headers["Authorization"] = f"Bearer {stage.credentials()['notebook_password']}"
    return http


def test_the_restore_drill_loses_no_write_acknowledged_before_the_backup(stage):
    """The drill an admin repeats (ops/README.md, "Backups"): writes on every service
    through nginx, the timer's unit backing up while they go on, more writes; the box
    is lost, a new one provisioned by ansible-pull and restored with one command. Every
    write acknowledged before the backup began is there; tokens sign in; the notebook's
    stored key decrypts; the deck session's next seq passes every seq handed out after
    the backup. Prints the write p99 with and without the backup, its duration and size,
    and the time from the restore command to every service serving."""
    assert stage.systemctl("is-enabled", "bundle-backup.timer") == "enabled"
    key = _notebook(stage).post(
        stage.base + "/api/credentials", json={"name": "drill", "provider": "openai", "api_key": "sk-drill"}, timeout=30
    )
    assert key.status_code == 201, key.text
    loop = LoadLoop(stage.open_client, stage.credentials())
    with loop.running():
        started = time.monotonic()
        stage.box.run("systemctl", "start", "bundle-backup.service", timeout=900)  # oneshot: returns when done
        ended = time.monotonic()
        wait_for(lambda: time.monotonic() >= ended + (ended - started), "a window as long as the backup, without it")
    loop.streams_stop.set()  # the held streams are not checked here
    assert loop.failures() == {}, loop.summary()
    during, without = loop.write_latencies(started, ended), loop.write_latencies(ended, ended + (ended - started))
    created = stage.box.run("journalctl", "-u", "bundle-backup", "-o", "cat", "--no-pager").stdout
    line = [row for row in created.splitlines() if row.startswith("created snapshot")][-1]
    status = stage.box.run("cat", "/var/lib/prometheus/node-exporter/bundle_backup.prom").stdout
    assert 'bundle_backup_last_run_success{store="files"} 1.000' in status, status
    before = loop.acknowledged_before(started)
    assert all(before[name] for name in ("decks", "wizard", "notebook", "workspace")), before
    highest = max(loop.tallies["decks"].acknowledged)
    password = stage.credentials()["backup_repository_password"]
    host_name = stage.box.run("hostname").stdout.strip()

    stage.box.poweroff()  # the host is lost: its disk with it
    settings = stage.host_settings
    box = stage.boxes.enter_context(staging.Box.boot(stage.root, binds=settings.binds, ro_binds=settings.ro_binds))
    stage.box = box
    pulled = settings.provision(box, secrets={"backup_repository_password": password})
    assert recap(pulled.stdout)["failed"] == "0", pulled.stdout[-3000:]
    restore_began = time.monotonic()
    restored = box.run("bundle-backup", "restore", "latest", "--host", host_name, check=False, timeout=1800)
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    wait_for(lambda: _serving(stage), "every service serving through nginx after the restore", timeout=300)
    recovery = time.monotonic() - restore_began

    assert loop.missing_writes(among=before) == {}, loop.summary()  # the sign-ins' tokens among them
    session = next(w for w in loop.workloads if w.service == "decks").session
    after = stage.client("decks").post(
        stage.base + f"/api/sessions/{session}/events",
        json={"type": "note", "slide": 0, "text": "restored"},
        timeout=30,
    )
    assert after.status_code == 201 and after.json()["seq"] > highest, (after.text, highest)
    credential = _notebook(stage).get(stage.base + f"/api/credentials/{key.json()['id']}", timeout=30).json()
    assert credential["has_api_key"] and credential["decryption_error"] is None, credential
    # The new host holds data now: a second restore refuses, and the services serve on.
    again = box.run("bundle-backup", "restore", "latest", check=False, timeout=600)
    assert again.returncode == 1 and "error: this host holds data (" in again.stderr, again.stderr
    wait_for(lambda: _serving(stage), "every service serving again after the refused restore", timeout=120)
    print(
        f"\nrestore drill (one host, SQLite): {line}\n"
        f"  backup took {ended - started:.1f} s; write p99 {p99(during) * 1000:.0f} ms during it "
        f"({len(during)} writes), {p99(without) * 1000:.0f} ms without ({len(without)} writes)\n"
        f"  restore to serving (RTO, from `bundle-backup restore`): {recovery:.0f} s\n{loop.summary()}"
    )
