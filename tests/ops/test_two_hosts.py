"""Two application hosts and a data host on a private network of their own
(devtools.private_network), each a staging box provisioned by the real bootstrap.sh
(ansible-pull), behind a front nginx that balances TCP across the application
hosts (its stream module: `upstream` with passive health checks).

    data    PostgreSQL and Redis (the data role); Prometheus, Alertmanager (the monitoring role)
    app-a   every service, WEB_CONCURRENCY=2, on data's servers, its workspace mesh on its address
    app-b   the same
    front   nginx: :443 -> app-a:443, app-b:443 (decks: app-a, app-b its backup)
    idp     the stand-in OpenID provider, one for the deployment
    client  a host whose names (*.staging.test) lead to the front: agents and clients run there

The hosts share one secrets file (made by the data host's first pull) and one
certificate. The hosts are first provisioned with the previous release (0.2.0, commit
PREVIOUS_RELEASE) and the first tests upgrade them, one host at a time, to the working
tree. Tests run in file order on one deployment (module scope); after the monitoring
test the data host is lost and replaced by a restored one (the restore drill), so that
every later test runs on the restored data tier; the last but one powers an
application host off. Every host runs the exporters of the monitoring role; the
data host takes the monitoring role itself once the application hosts are upgraded
(0.2.0 has none), and its Alertmanager sends to a webhook the test listens on.
"""

import contextlib
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import urllib3
import yaml

from app import registry
from devtools import private_network, staging
from devtools.fake_providers import FakeProviders
from devtools.load_loop import LoadLoop, p99
from devtools.waiting import wait_for
from tests.support.ops import group_vars, in_parallel, recap, site_session
from tests.support.workspace import agent_program, http_on, websocket_on

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "staging.test"
SERVICES = registry.NAMES
USER, PASSWORD = "alice", "staging-" + uuid.uuid4().hex
# The platform's Owner, created by the playbook (its password: the shared secrets file's).
OWNER = {"email": "owner@staging.test", "username": "owner"}
GROUP_VARS = group_vars()
MONITORING = yaml.safe_load((ROOT / "ops/roles/monitoring/defaults/main.yml").read_text())
# Release 0.2.0, the one before this: the deployment starts on it, the rolling upgrade
# brings it to the working tree.
PREVIOUS_RELEASE = "bacec1fa5897d73fbf3973bf5c1cf8533ddf94ba"
BACKUP_REPOSITORY = "/srv/backup"  # in the data box: a folder of this machine, as an off-host disk would be
# The services whose schema has a contract step since 0.2.0.
CONTRACTED = ("wizard",)
urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
# The monitoring role's intervals on the staging hosts: seconds, not minutes.
MONITORING_INTERVALS = {
    "monitoring_scrape_interval": "2s",
    "monitoring_evaluation_interval": "2s",
    "monitoring_target_down_for": "6s",
    "monitoring_alert_group_wait": "1s",
    "monitoring_alert_group_interval": "2s",
}

FRONT_CONF = """
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 4096; }}
stream {{
    upstream applications {{
        server {a}:443 max_fails=1 fail_timeout=10s{a_down};
        server {b}:443 max_fails=1 fail_timeout=10s{b_down};
    }}
    # The deck service keeps its sessions in files on its host: one host serves it,
    # the other takes over (with its own files) only when the first is down. It is never
    # drained (its data does not move): its restarts queue in its socket instead.
    upstream decks {{
        server {a}:443 max_fails=1 fail_timeout=10s;
        server {b}:443 backup;
    }}
    map $ssl_preread_server_name $application {{
        decks.{domain} decks;
        default applications;
    }}
    server {{
        listen {front}:443;
        ssl_preread on;
        proxy_pass $application;
        proxy_connect_timeout 2s;
        # A host gone silent frees its streams' clients after this (SSE keepalives come every 25 s).
        proxy_timeout 30s;
    }}
}}
"""


class Deployment:
    def __init__(self, lan, hosts, boxes, certificate, first_pulls, secrets, repo, folder):
        self.lan, self.hosts, self.boxes = lan, hosts, boxes
        self.certificate, self.first_pulls = certificate, first_pulls
        self.secrets = secrets  # the one secrets file every host has (made by the data host)
        self.repo, self.folder = repo, folder  # what the hosts pull from; the front's files

    def open_client(self, service):
        """A client of `service` through the front, and its base URL (devtools.load_loop)."""
        http = self.client(service)
        return http, http.base

    def credentials(self):
        return {**self.secrets, "workspace_owner_email": OWNER["email"]}

    def drain(self, host=None):
        """The front sends no new connection to application host `host` (None: to both
        again), as an admin marks it `down` and reloads; returns once the front's new
        workers took over (the old ones keep the connections they have)."""
        front = self.hosts["front"]
        before = _children(self.folder / "nginx.pid")
        _write_front_conf(self.folder, front, [self.hosts["app-a"], self.hosts["app-b"]], down=host)
        reloaded = self.lan.run(front, "nginx", "-c", self.folder / "front.conf", "-p", self.folder, "-s", "reload")
        assert reloaded.returncode == 0, reloaded.stderr
        wait_for(lambda: _children(self.folder / "nginx.pid") - before, "the front's new workers")

    def url(self, host="front"):
        return f"https://{self.hosts[host].address}"

    def client(self, service, host="front"):
        """requests to `service` through the front (or straight to an application host)."""
        return site_session(f"{service}.{DOMAIN}", self.url(host))

    def in_client(self, *argv, env=None, **kwargs):
        """A process on the client host, where the public names lead to the front."""
        trust = str(self.certificate)
        environment = {"SSL_CERT_FILE": trust, "REQUESTS_CA_BUNDLE": trust, **(env or {})}
        return subprocess.Popen(
            self.lan.run_command(self.hosts["client"], "env", *[f"{k}={v}" for k, v in environment.items()], *argv),
            cwd=ROOT,
            **kwargs,
        )

    def redis(self, *command):
        return (
            self.boxes["data"]
            .run(
                "redis-cli",
                "-a",
                self.secrets["redis_password"],
                "--no-auth-warning",
                "-n",
                str(GROUP_VARS["bundle_redis_databases"]["workspace"]),
                *command,
            )
            .stdout.strip()
        )

    def psql(self, service, sql):
        return (
            self.boxes["data"]
            .run("runuser", "-u", "postgres", "--", "psql", "-d", f"bundle_{service}", "-Atc", sql)
            .stdout.strip()
        )


def _certificate(folder):
    names = ",".join(f"DNS:{s}.{DOMAIN}" for s in (*SERVICES, "auth"))
    crt, key = folder / "bundle.crt", folder / "bundle.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            f"/CN=workspace.{DOMAIN}",
            "-addext",
            f"subjectAltName={names}",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return crt, key


def _application_vars(host, data, idp, ai):
    return {
        "bundle_roles": ["services", "nginx"],
        "bundle_domain": DOMAIN,
        "bundle_data_host": data.address,
        "services_web_concurrency": 2,
        "services_mesh_address": host.address,
        # The exporters and the services' /metrics on the private address, for the data host's Prometheus.
        "monitoring_listen_address": host.address,
        "monitoring_allowed_addresses": [data.address],
        "services_workspace_owner_username": OWNER["username"],
        "services_workspace_owner_email": OWNER["email"],
        "nginx_http_redirect_port": "",
        "nginx_tls_certificate": "/etc/bundle/staging-tls/bundle.crt",
        "nginx_tls_certificate_key": "/etc/bundle/staging-tls/bundle.key",
        "bundle_auth_url": f"http://{idp.address}:9091",
        "bundle_auth_request_url": f"http://{idp.address}:9091/api/authz/auth-request",
        "services_env_extra": {
            "wizard": {
                "WIZ_AI_BASE_URL": ai.base_url(),
                "WIZ_TEXT_MODEL": "fake-valid-json",
                "WIZ_IMAGE_MODEL": "fake-webp",
                "WIZ_AI_PROVIDER": "local-fake",
            }
        },
    }


def _pull(box, settings, bootstrap, files=()):
    for path, text, mode in files:
        box.run(
            "sh",
            "-c",
            f"install -d -m 0755 $(dirname {path}) && umask 077 && cat > {path} && chmod {mode} {path}",
            input=text,
        )
    box.run("sh", "-c", "install -d -m 0755 /etc/bundle && cat > /etc/bundle/vars.yml", input=yaml.safe_dump(settings))
    box.run("sh", "-c", "cat > /root/bootstrap.sh", input=bootstrap)
    return box.run(
        "bash", "/root/bootstrap.sh", "--repo", "/srv/bundle.git", "--branch", "staging", timeout=1200
    ).stdout


def _start_idp(lan, idp, secrets, folder):
    clients = {
        "identity_providers": {
            "oidc": {
                "clients": [
                    {
                        "client_id": GROUP_VARS["bundle_oidc_client_id"],
                        "client_name": "Workspace platform",
                        "client_secret": secrets["workspace_oidc_client_secret_digest"],
                        "public": False,
                        "require_pkce": True,
                        "pkce_challenge_method": "S256",
                        "redirect_uris": [f"https://workspace.{DOMAIN}/api/v2/users/oidc/callback"],
                        "scopes": ["openid", "profile", "email", "groups"],
                        "grant_types": ["authorization_code"],
                        "response_types": ["code"],
                        "token_endpoint_auth_method": "client_secret_basic",
                    }
                ]
            }
        }
    }
    (folder / "clients.yml").write_text(yaml.safe_dump(clients))
    (folder / "users.yml").write_text(
        yaml.safe_dump(
            {"users": [{"username": USER, "password": PASSWORD, "email": f"{USER}@{DOMAIN}", "groups": ["admins"]}]}
        )
    )
    log = open(folder / "idp.log", "wb")
    process = subprocess.Popen(
        lan.run_command(
            idp,
            sys.executable,
            "-m",
            "devtools.authelia_config",
            "serve",
            "--authelia-config",
            folder / "clients.yml",
            "--users",
            folder / "users.yml",
            "--issuer",
            f"http://{idp.address}:9091",
            "--host",
            idp.address,
            "--port",
            "9091",
        ),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_for(
        lambda: _answers(f"http://{idp.address}:9091/.well-known/openid-configuration"), "the provider", timeout=30
    )
    return process


def _answers(url):
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _write_front_conf(folder, front, apps, down=None):
    marks = {"a_down": " down" if down == "app-a" else "", "b_down": " down" if down == "app-b" else ""}
    (folder / "front.conf").write_text(
        FRONT_CONF.format(dir=folder, a=apps[0].address, b=apps[1].address, front=front.address, domain=DOMAIN, **marks)
    )


def _children(pid_file):
    """The pids of the worker processes of the nginx whose master's pid is in `pid_file`."""
    master = pid_file.read_text().strip()
    path = Path(f"/proc/{master}/task/{master}/children")
    return set(path.read_text().split()) if path.exists() else set()


def _start_front(lan, front, apps, folder):
    _write_front_conf(folder, front, apps)
    process = subprocess.Popen(
        lan.run_command(front, "nginx", "-c", folder / "front.conf", "-p", folder, "-g", "daemon off;"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: _connects(front.address, 443), "the front", timeout=30)
    return process


def _connects(address, port):
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return True
    return False


def _stop(process):
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class AlertWebhook:
    """The admin's receiver of the alerts: an HTTP server on the private network's
    gateway that keeps the alerts of each notification Alertmanager posts (its webhook
    JSON: {"alerts": [{"status": "firing" | "resolved", "labels": {...}}, ...]})."""

    def __init__(self, host):
        self.alerts = []
        received = self.alerts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.extend(json.loads(body).get("alerts", []))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, status, **labels):
        """The alerts received with `status` whose labels include `labels`."""
        return [
            alert
            for alert in list(self.alerts)
            if alert.get("status") == status and labels.items() <= alert.get("labels", {}).items()
        ]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _probes_reach_the_front(box, front, certificate):
    """The public names lead `box` (the data host, whose blackbox exporter probes them)
    to the front, and it trusts the deployment's certificate."""
    names = " ".join(f"{s}.{DOMAIN}" for s in SERVICES)
    box.run("sh", "-c", f"echo '{front.address} {names}' >> /etc/hosts")
    box.run("sh", "-c", "cat > /usr/local/share/ca-certificates/staging-bundle.crt", input=certificate.read_text())
    box.run("update-ca-certificates", timeout=120)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    reason = staging.nspawn_unavailable() or private_network.unavailable()
    if reason:
        pytest.skip(f"!!! STAGING BOXES NOT RUN: {reason} !!!")
    root = staging.ensure_root(log=lambda line: print(line, file=sys.stderr))
    work = tmp_path_factory.mktemp("two-hosts")
    repo, bootstrap = staging.publish_snapshot(work, commit=PREVIOUS_RELEASE)
    crt, key = _certificate(work)
    debs, pip_cache = staging.CACHE / "debs", staging.CACHE / "pip"
    debs.mkdir(parents=True, exist_ok=True)
    pip_cache.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        lan = stack.enter_context(private_network.PrivateNetwork())
        hosts = {name: lan.add(name) for name in ("data", "app-a", "app-b", "front", "idp")}
        hosts["client"] = lan.add("client", hosts={f"{s}.{DOMAIN}": hosts["front"].address for s in SERVICES})
        ai = stack.enter_context(FakeProviders(host=lan.gateway))
        webhook = stack.enter_context(AlertWebhook(lan.gateway))
        boxes, pulls, binds = {}, {}, {}
        offsite = work / "backup-repository"  # the data host's backups: outside it, as an off-host disk
        offsite.mkdir()
        for name in ("data", "app-a", "app-b"):
            # apt's cache of packages for the data host only: the application hosts pull
            # at the same time, and apt locks its cache.
            cache = (debs, "/var/cache/apt/archives") if name == "data" else (pip_cache, "/root/.cache/pip")
            binds[name] = [cache, (offsite, BACKUP_REPOSITORY)] if name == "data" else [cache]
            boxes[name] = stack.enter_context(
                staging.Box.boot(root, binds=binds[name], ro_binds=[(repo, "/srv/bundle.git")], netns=hosts[name].netns)
            )
            boxes[name].trust_host_certificates()
        _probes_reach_the_front(boxes["data"], hosts["front"], crt)
        started = time.monotonic()
        app_hosts = [hosts["app-a"].address, hosts["app-b"].address]
        data_settings = {
            "bundle_roles": ["data", "monitoring"],
            "data_listen_addresses": ["127.0.0.1", hosts["data"].address],
            "data_allowed_networks": ["127.0.0.1/32", *(f"{a}/32" for a in app_hosts)],
            "data_postgresql_max_connections": 400,
            # The monitoring role: 0.2.0 has none; the data host takes it in
            # test_monitoring_sees_every_host_and_alerts_at_the_webhook.
            "bundle_domain": DOMAIN,
            "monitoring_listen_address": hosts["data"].address,
            "monitoring_application_hosts": app_hosts,
            "monitoring_data_hosts": [hosts["data"].address],
            "monitoring_alert_webhook_url": webhook.url,
            # pgBackRest's repository leaves the host with each restic run (0.2.0 has neither).
            "backup_repository": BACKUP_REPOSITORY,
            **MONITORING_INTERVALS,
        }
        pulls["data"] = _pull(boxes["data"], data_settings, bootstrap)
        print(f"two hosts: the data host's pull {time.monotonic() - started:.0f} s", file=sys.stderr)
        secrets_text = boxes["data"].run("cat", "/etc/bundle/secrets.json").stdout
        idp = _start_idp(lan, hosts["idp"], json.loads(secrets_text), work)
        stack.callback(_stop, idp)
        files = [
            ("/etc/bundle/secrets.json", secrets_text, "0600"),
            ("/etc/bundle/staging-tls/bundle.crt", crt.read_text(), "0644"),
            ("/etc/bundle/staging-tls/bundle.key", key.read_text(), "0600"),
        ]

        def pull(name):
            pulls[name] = _pull(
                boxes[name], _application_vars(hosts[name], hosts["data"], hosts["idp"], ai), bootstrap, files
            )

        in_parallel(pull, ("app-a", "app-b"))
        print(f"two hosts: every pull done after {time.monotonic() - started:.0f} s", file=sys.stderr)
        front = _start_front(lan, hosts["front"], [hosts["app-a"], hosts["app-b"]], work)
        stack.callback(_stop, front)
        deployment = Deployment(lan, hosts, boxes, crt, pulls, json.loads(secrets_text), repo, work)
        deployment.webhook = webhook
        # What the restore drill needs to provision a new data host as the first one was.
        deployment.stack, deployment.root, deployment.binds = stack, root, binds
        deployment.data_settings, deployment.bootstrap = data_settings, bootstrap
        yield deployment


# --------------------------------------------------------------------------- the deployment


def test_every_host_is_provisioned_and_serves(deployment):
    for name, output in deployment.first_pulls.items():
        assert recap(output)["failed"] == "0", (name, output[-3000:])
    for name in ("app-a", "app-b"):
        env = deployment.boxes[name].run("cat", "/etc/bundle/workspace.env").stdout
        assert f'WORKSPACE_MESH_ADDRESS="{deployment.hosts[name].address}"' in env
        assert f"@{deployment.hosts['data'].address}:" in env and 'WEB_CONCURRENCY="2"' in env
        for service in SERVICES:
            answer = deployment.client(service, host=name).get(deployment.url(name) + _health(service), timeout=30)
            assert answer.status_code == 200, (name, service, answer.text[:300])


@contextlib.contextmanager
def _step(steps, name):
    """Times the block: `steps[name] = (started, ended)` (time.monotonic())."""
    started = time.monotonic()
    yield
    steps[name] = (started, time.monotonic())


def _ready(deployment, host):
    """Whether every service of `host` answers its /readyz with 200 (straight, not through the front)."""
    for service in SERVICES:
        http = deployment.client(service, host=host)
        with contextlib.suppress(requests.RequestException):
            if http.get(http.base + "/readyz", timeout=10).status_code == 200:
                continue
        return False
    return True


def _contract(deployment, host, service):
    """`bundle <service> contract` on `host`, as an admin runs it."""
    return deployment.boxes[host].run("bundle", service, "contract", check=False, timeout=300)


def _rolling_upgrade(deployment, agent, commit, title, from_0_2_0=False, between=None):
    """Publishes `commit` and upgrades the application hosts to it one at a time, as
    ops/README.md says, under a load loop through the front: the front drains the host,
    ansible-pull upgrades it (the play ends once every service is ready), the front takes
    it back. From 0.2.0 the host's nginx also lets the front's kept connections go first
    (the services move to their sockets by one stop). `between(host)` runs after each
    host. Returns the loop, stopped, with its summary printed, and {step: (started, ended)}."""
    staging.publish(deployment.repo, commit)
    loop = LoadLoop(deployment.open_client, deployment.credentials())
    steps = {}
    with loop.running():
        for host in ("app-a", "app-b"):
            with _step(steps, f"{host}: drained at the front"):
                deployment.drain(host)
            if from_0_2_0:
                with _step(steps, f"{host}: its nginx lets the front's kept connections go"):
                    deployment.boxes[host].run("systemctl", "reload", "nginx")
            with _step(steps, f"{host}: ansible-pull"):
                pulled = deployment.boxes[host].run("bash", "/root/bootstrap.sh", timeout=1200).stdout
            assert recap(pulled)["failed"] == "0", pulled[-4000:]
            with _step(steps, f"{host}: every service ready"):
                wait_for(lambda host=host: _ready(deployment, host), f"{host} to be ready", timeout=120)
            if between:
                between(host)
            with _step(steps, f"{host}: back in the front"):
                deployment.drain(None)
        with _step(steps, "the agent connected again"):
            wait_for(lambda: _status(deployment, agent, "front") == "connected", "the agent", timeout=120)
    lines = [f"  {name}: {ended - started:.1f} s" for name, (started, ended) in steps.items()]
    print(f"\nrolling upgrade {title}:\n" + "\n".join(lines) + "\n" + loop.summary())
    assert loop.missing_writes() == {}
    assert loop.stream_faults() == []
    app = deployment.client("workspace")
    answer = app.get(app.base + "/@owner/dev.main/apps/echo/hello", headers=agent.headers, timeout=30)
    assert (answer.status_code, answer.content) == (200, b"hello from the app\n")
    return loop, steps


def test_a_rolling_upgrade_from_the_previous_release(deployment, agent):
    """0.2.0 -> the working tree. What the one move to socket activation costs is printed:
    the deck service (never drained: its data lives on its host) is refused while app-a's
    stops, and a request may meet a kept connection that its host's nginx closes as it
    drains. The contract steps refuse while app-b still runs 0.2.0, and run after."""
    refusals = {}

    def contract_while_app_b_is_old(host):
        if host == "app-a":
            refusals.update({s: _contract(deployment, "app-a", s) for s in CONTRACTED})

    loop, steps = _rolling_upgrade(
        deployment,
        agent,
        staging.snapshot_commit(),
        "0.2.0 -> working tree",
        from_0_2_0=True,
        between=contract_while_app_b_is_old,
    )
    # The deck service: refused (nginx's 502) only while app-a's pull moves it to its socket.
    failures = loop.failures()
    started, ended = steps["app-a: ansible-pull"]
    refused = [moment for kind, moment in loop.tallies["decks"].failed_at if kind == "5xx"]
    assert all(started <= moment <= ended for moment in refused), loop.summary()
    failures.get("decks", {}).pop("5xx", None)
    # Every client (the deck service's too) at most meets the one kept connection that its
    # host's nginx closed as the client sent on it (a browser sends such a request again).
    assert all(kinds.keys() <= {"connection"} and sum(kinds.values()) <= 1 for kinds in failures.values()), (
        loop.summary()
    )
    app_b = deployment.hosts["app-b"].address
    for service, refused in refusals.items():  # one line, naming app-b (0.2.0's connections to the database)
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert refused.returncode == 1 and len(errors) == 1 and app_b in errors[0], (service, refused.stderr)
    for service in CONTRACTED:
        done = _contract(deployment, "app-a", service)
        assert done.returncode == 0, done.stdout + done.stderr
        again = _contract(deployment, "app-b", service)
        assert again.returncode == 0 and "nothing to contract" in again.stdout, again.stdout + again.stderr


def test_a_rolling_upgrade_to_the_next_release_fails_no_request(deployment, agent):
    """The working tree -> a next release (a new commit: every service restarts), once the
    services listen on their sockets: not one failed request, the deck service included."""
    moved = deployment.boxes["app-a"].run("systemctl", "is-active", "bundle@decks.socket", check=False).stdout
    assert moved.strip() == "active", "the hosts still run 0.2.0: this test follows the upgrade from it"
    commit = staging.snapshot_commit(message="the next release (staging)")
    loop, _ = _rolling_upgrade(deployment, agent, commit, "working tree -> next release")
    assert loop.failures() == {}, loop.summary()


# --------------------------------------------------------------------------- monitoring


def _prometheus(deployment):
    return f"http://{deployment.hosts['data'].address}:{MONITORING['monitoring_prometheus_port']}"


def _query(deployment, promql):
    """The result of `promql` at the data host's Prometheus: {instance: value}."""
    http = requests.Session()
    http.trust_env = False
    answer = http.get(_prometheus(deployment) + "/api/v1/query", params={"query": promql}, timeout=10)
    answer.raise_for_status()
    return {item["metric"].get("instance", ""): float(item["value"][1]) for item in answer.json()["data"]["result"]}


def _targets(deployment):
    http = requests.Session()
    http.trust_env = False
    answer = http.get(_prometheus(deployment) + "/api/v1/targets", timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]["activeTargets"]


def test_monitoring_sees_every_host_and_alerts_at_the_webhook(deployment):
    """The data host takes the monitoring role (its pull of the release the application
    hosts run): Prometheus scrapes every host's exporters and every service of both
    application hosts, probes the public hosts through the front; requests made through
    the front count on both hosts; a service stopped on app-a fires its alert at the
    webhook, which hears it resolved once the service is back."""
    data, hosts = deployment.boxes["data"], deployment.hosts
    started = time.monotonic()
    pulled = data.run("bash", "/root/bootstrap.sh", timeout=1200).stdout
    assert recap(pulled)["failed"] == "0", pulled[-4000:]
    print(
        f"two hosts: the data host's pull with the monitoring role {time.monotonic() - started:.0f} s", file=sys.stderr
    )
    app_hosts = [hosts["app-a"].address, hosts["app-b"].address]
    jobs = {"node", "nginx", "postgresql", "redis", "prometheus", "alertmanager", "blackbox", "blackbox_exporter"}
    jobs |= {f"bundle_{s}" for s in SERVICES}

    def every_target_up():
        with contextlib.suppress(requests.RequestException):
            targets = _targets(deployment)
            probes = _query(deployment, "probe_success")
            databases = _query(deployment, "pg_up or redis_up")
            return (
                {t["labels"]["job"] for t in targets} == jobs
                and all(t["health"] == "up" for t in targets)
                and len(probes) == len(SERVICES)
                and set(probes.values()) == {1.0}
                and list(databases.values()) == [1.0, 1.0]
            )
        return False

    try:
        wait_for(every_target_up, "every target up at Prometheus", timeout=120)
    except TimeoutError:
        down = [(t["labels"]["job"], t["labels"]["instance"], t["lastError"]) for t in _targets(deployment)]
        raise AssertionError(
            f"targets: {[d for d in down if d[2]]}; probes: {_query(deployment, 'probe_success')}"
            f"; databases: {_query(deployment, 'pg_up or redis_up')}"
        ) from None
    per_host = {a: f"{a}:{MONITORING['monitoring_services_port']}" for a in app_hosts}
    assert {t["labels"]["instance"] for t in _targets(deployment) if t["labels"]["job"] == "bundle_wizard"} == set(
        per_host.values()
    )

    # Requests through the front (a new connection each: the front balances connections)
    # count on both application hosts, as `unmatched` routes of the audio service.
    counted = 'sum by (instance) (bundle_http_requests_total{job="bundle_audio", route="unmatched"})'
    before = _query(deployment, counted)
    for _ in range(12):
        http = deployment.client("audio")
        assert http.get(http.base + "/api/audio/no-such-route", timeout=30).status_code == 404
        http.close()
    wait_for(
        lambda: all(_query(deployment, counted).get(i, 0) > before.get(i, 0) for i in per_host.values()),
        "the requests through the front counted on both application hosts",
        timeout=60,
    )

    # The wizard stopped on app-a (its socket too: a scrape would start it again).
    wizard_a = {"alertname": "TargetDown", "job": "bundle_wizard", "instance": per_host[hosts["app-a"].address]}
    app_a = deployment.boxes["app-a"]
    stopped = time.monotonic()
    app_a.run("systemctl", "stop", "bundle@wizard.socket")
    try:
        wait_for(lambda: deployment.webhook.received("firing", **wizard_a), "the alert at the webhook", timeout=120)
        fired = time.monotonic()
    finally:
        app_a.run("systemctl", "start", "bundle@wizard.socket", "bundle@wizard.service")
    wait_for(lambda: deployment.webhook.received("resolved", **wizard_a), "the alert resolved", timeout=120)
    print(
        f"two hosts: the alert at the webhook {fired - stopped:.1f} s after the stop, resolved"
        f" {time.monotonic() - fired:.1f} s after the start",
        file=sys.stderr,
    )
    assert not deployment.webhook.received(
        "firing", alertname="TargetDown", job="bundle_wizard", instance=per_host[hosts["app-b"].address]
    )
    wait_for(lambda: _ready(deployment, "app-a"), "app-a ready again", timeout=60)


def _archived_through(deployment, box):
    """Switch PostgreSQL to a new WAL segment and wait until pgBackRest archived the one
    it closed: every commit before the call is then in the repository."""
    sql = ["runuser", "-u", "postgres", "--", "psql", "-Atc"]
    closed = box.run(*sql, "SELECT pg_walfile_name(pg_switch_wal())").stdout.strip()
    wait_for(
        lambda: box.run(*sql, "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver").stdout.strip() >= closed,
        f"WAL segment {closed} archived",
        timeout=120,
    )


def _blueprint(deployment, title):
    http = deployment.client("wizard")
    made = http.post(http.base + "/api/collections/blueprints", json={"title": title, "is_public": True}, timeout=60)
    assert made.status_code == 201, made.text
    return made.json()["id"]


def _has_blueprint(deployment, row):
    return deployment.psql("wizard", f"SELECT count(*) FROM blueprints WHERE id = '{row}'") == "1"


def _why_not_found(deployment, loop, before, restored):
    """What the test saw when the writes did not come back: for the failure's message."""
    try:
        missing = {name: len(rows) for name, rows in loop.missing_writes(among=before).items()}
    except Exception as exc:  # the services did not answer: say how
        missing = f"the check failed: {exc!r}"[:600]
    data = deployment.boxes["data"]
    shown = data.run(
        "sh",
        "-c",
        "systemctl --no-pager --failed; systemctl is-active postgresql redis-server;"
        " journalctl -n 40 --no-pager -u postgresql@15-main -u redis-server",
        check=False,
    )
    app = deployment.boxes["app-a"].run(
        "sh", "-c", "journalctl -n 30 --no-pager -u bundle@wizard -u bundle@workspace", check=False
    )
    return (
        f"missing after the restore: {missing}\n--- restore:\n{restored.stderr[-2500:]}\n"
        f"--- data host:\n{shown.stdout[-3000:]}\n--- app-a:\n{app.stdout[-3000:]}"
    )


def _agent_serves(deployment, agent):
    """Whether the agent's app answers through each application host."""
    for host in ("app-a", "app-b"):
        try:
            sock = _tls_to(deployment, host)
            try:
                answer = http_on(
                    sock, "GET", "/@owner/dev.main/apps/echo/hello", agent.headers, host=f"workspace.{DOMAIN}"
                )
            finally:
                sock.close()
        except OSError:
            return False
        if answer != (200, b"hello from the app\n"):
            return False
    return True


def _found(loop, among):
    """Whether every write of `among` is found (False while the services still recover)."""
    with contextlib.suppress(Exception):
        return loop.missing_writes(among=among) == {}
    return False


def test_the_data_host_lost_is_restored_and_recovers_to_a_point_in_time(deployment, agent):
    """The restore drill on PostgreSQL: a full pgBackRest backup while writes go on
    through the front, more writes archived, the restic run that takes the repository
    off the host; the data host is lost, a new one provisioned by ansible-pull and
    restored with one command: every write acknowledged before the archive's point is
    in the new primary, tokens sign in. Then a point-in-time recovery to a moment
    between two acknowledged writes has the first and not the second, and a recovery
    forward again on the old timeline has both."""
    data, hosts = deployment.boxes["data"], deployment.hosts
    loop = LoadLoop(deployment.open_client, deployment.credentials())
    with loop.running():
        started = time.monotonic()
        data.run("systemctl", "start", "bundle-pg-backup@full.service", timeout=900)  # the backup, then its verify
        ended = time.monotonic()
        wait_for(lambda: time.monotonic() >= ended + (ended - started), "a window as long as the backup, without it")
        first = _blueprint(deployment, "before the moment")
        moment = deployment.psql("wizard", "SELECT now()")
        second = _blueprint(deployment, "after the moment")
        point = time.monotonic()
        _archived_through(deployment, data)
        data.run("systemctl", "start", "bundle-backup.service", timeout=900)  # pgBackRest's repository leaves the host
    loop.streams_stop.set()  # the held streams are not checked here
    assert loop.failures() == {}, loop.summary()
    during, without = loop.write_latencies(started, ended), loop.write_latencies(ended, ended + (ended - started))
    before = loop.acknowledged_before(point)
    assert all(before[name] for name in ("decks", "wizard", "notebook", "workspace")), before
    info = json.loads(
        data.run("runuser", "-u", "postgres", "--", "pgbackrest", "--stanza=bundle", "info", "--output=json").stdout
    )
    size = info[0]["backup"][-1]["info"]["repository"]["delta"]
    password = json.loads(data.run("cat", "/etc/bundle/secrets.json").stdout)["backup_repository_password"]

    data.poweroff()  # the data host is lost, its disk with it
    new = deployment.stack.enter_context(
        staging.Box.boot(
            deployment.root,
            binds=deployment.binds["data"],
            ro_binds=[(deployment.repo, "/srv/bundle.git")],
            netns=hosts["data"].netns,
        )
    )
    new.trust_host_certificates()
    _probes_reach_the_front(new, hosts["front"], deployment.certificate)
    deployment.boxes["data"] = new
    seeded = [("/etc/bundle/secrets.json", json.dumps({"backup_repository_password": password}), "0600")]
    pulled = _pull(new, deployment.data_settings, deployment.bootstrap, seeded)
    assert recap(pulled)["failed"] == "0", pulled[-3000:]
    restore_began = time.monotonic()
    restored = new.run("bundle-backup", "restore", "latest", check=False, timeout=1800)
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    try:
        wait_for(lambda: _found(loop, before), "every write acknowledged before the backup, through the front", 300)
    except TimeoutError:
        pytest.fail(_why_not_found(deployment, loop, before, restored))
    recovery = time.monotonic() - restore_began
    assert _has_blueprint(deployment, first) and _has_blueprint(deployment, second)

    timeline = new.run(
        "runuser", "-u", "postgres", "--", "psql", "-Atc", "SELECT timeline_id FROM pg_control_checkpoint()"
    )
    new.run("bundle-pg-restore", "--replace", "--target-time", moment, timeout=900)
    assert _has_blueprint(deployment, first) and not _has_blueprint(deployment, second)
    new.run("bundle-pg-restore", "--replace", "--target-timeline", timeline.stdout.strip(), timeout=900)
    assert _has_blueprint(deployment, first) and _has_blueprint(deployment, second)
    wait_for(
        lambda: all(_ready(deployment, h) for h in ("app-a", "app-b")), "both application hosts ready", timeout=120
    )
    # As ops/README.md says after a data host's restore: the platform restarted on each
    # application host (a restart refuses no request), so that no worker keeps an agent
    # connection from before Redis came back empty; the agent then connects once again.
    for host in ("app-a", "app-b"):
        deployment.boxes[host].run("systemctl", "restart", "bundle@workspace.service", timeout=120)
    wait_for(lambda: _agent_serves(deployment, agent), "the agent's app served through both hosts again", 300)
    print(
        f"\nrestore drill (PostgreSQL on the data host): full backup {ended - started:.1f} s, {size} bytes stored;"
        f" write p99 {p99(during) * 1000:.0f} ms during it ({len(during)} writes),"
        f" {p99(without) * 1000:.0f} ms without ({len(without)} writes);"
        f" restore to serving (RTO, from `bundle-backup restore`): {recovery:.0f} s",
        file=sys.stderr,
    )


def test_the_data_host_serves_postgresql_and_redis_to_the_application_hosts_only(deployment):
    data = deployment.boxes["data"]
    secrets = deployment.secrets
    for value in secrets.values():
        assert value not in deployment.first_pulls["data"]
    assert not data.run("sh", "-c", "ls /etc/bundle/*.env 2>/dev/null", check=False).stdout  # no service there
    for service in GROUP_VARS["bundle_database_services"]:  # psql inside the box, over TCP with the password
        out = data.run(
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            f"bundle_{service}",
            "-d",
            f"bundle_{service}",
            "-Atc",
            "SELECT current_user, current_setting('password_encryption')",
            env={"PGPASSWORD": secrets[f"postgresql_{service}_password"]},
        ).stdout.strip()
        assert out == f"bundle_{service}|scram-sha-256"
    wrong = data.run(
        "psql",
        "-h",
        "127.0.0.1",
        "-U",
        "bundle_wizard",
        "-d",
        "bundle_wizard",
        "-c",
        "SELECT 1",
        env={"PGPASSWORD": "wrong"},
        check=False,
    )
    assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr
    # The services' drivers from an application host, and from a host pg_hba.conf names nowhere.
    allowed = _connect_from(deployment, "app-a", secrets)
    assert allowed.stdout.split("\n")[:2] == ["postgresql 1", "redis True"], allowed.stdout + allowed.stderr
    refused = _connect_from(deployment, "client", secrets)
    assert "postgresql refused:" in refused.stdout and "no pg_hba.conf entry" in refused.stdout, (
        refused.stdout + refused.stderr
    )
    redis_cli = ["redis-cli", "-h", "127.0.0.1"]
    assert "NOAUTH" in data.run(*redis_cli, "ping").stdout
    assert data.run(
        *redis_cli, "-a", secrets["redis_password"], "--no-auth-warning", "config", "get", "appendonly"
    ).stdout.split() == ["appendonly", "yes"]
    for unit in ("postgresql.service", "redis-server.service"):
        assert data.run("systemctl", "is-enabled", unit).stdout.strip() == "enabled"
    assert data.run("stat", "-c", "%a %U", "/etc/redis/redis.conf").stdout.strip() == "640 redis"


def _connect_from(deployment, host, secrets, service="notebook"):
    """psycopg and redis-py from `host`'s namespace to the data host's private
    address: what each printed, or PostgreSQL's refusal."""
    data = deployment.hosts["data"].address
    script = f"""
import psycopg, redis
try:
    with psycopg.connect(host={data!r}, user="bundle_{service}", dbname="bundle_{service}", connect_timeout=10,
                         password={secrets[f"postgresql_{service}_password"]!r}) as conn:
        print("postgresql", conn.execute("SELECT 1").fetchone()[0])
except psycopg.Error as exc:
    print("postgresql refused:", str(exc).strip().splitlines()[-1])
print("redis", redis.Redis(host={data!r}, password={secrets["redis_password"]!r}, socket_timeout=10).ping())
"""
    return deployment.lan.run(deployment.hosts[host], sys.executable, "-c", script, timeout=60)


def _health(service):
    return {"notebook": "/health", "audio": "/api/audio/health"}.get(service, "/healthz")


def test_acceptance_suite_passes_through_the_front(deployment):
    options = ["--insecure"]
    for service in SERVICES:
        options += [f"--{service}-url", deployment.url(), f"--{service}-host", f"{service}.{DOMAIN}"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/acceptance", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# --------------------------------------------------------------------------- an agent behind the front


class Agent:
    """The owner, a workspace whose agent runs on the client host behind the front,
    and the app it serves there."""


@pytest.fixture(scope="module")
def agent(deployment, tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-hosts-agent")
    setup = Agent()
    http = deployment.client("workspace")
    claimed = http.get(http.base + "/api/v2/users/first", timeout=30)
    assert claimed.status_code == 200, claimed.text  # the playbook created the Owner
    setup.token = http.post(
        http.base + "/api/v2/users/login",
        json={"email": OWNER["email"], "password": deployment.secrets["workspace_owner_password"]},
        timeout=30,
    ).json()["session_token"]
    setup.headers = {"Workspace-Session-Token": setup.token}
    app_port = 8899
    setup.app = deployment.in_client(
        sys.executable,
        "-m",
        "tests.support.workspace_app",
        str(app_port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    made = http.post(
        http.base + "/api/v2/users/me/workspaces",
        headers=setup.headers,
        timeout=30,
        json={
            "name": "dev",
            "agents": [{"name": "main", "apps": [{"slug": "echo", "url": f"http://127.0.0.1:{app_port}"}]}],
        },
    )
    assert made.status_code == 201, made.text
    setup.id, agent_token = made.json()["agents"][0]["id"], made.json()["agents"][0]["token"]
    setup.log = open(folder / "agent.log", "wb")
    setup.process = deployment.in_client(
        *agent_program(),
        "agent",
        "--url",
        f"https://workspace.{DOMAIN}",
        env={"WORKSPACE_AGENT_TOKEN": agent_token, "SHELL": "/bin/sh"},
        stdout=setup.log,
        stderr=subprocess.STDOUT,
    )
    wait_for(lambda: _status(deployment, setup, "front") == "connected", "the agent connected", timeout=60)
    yield setup
    for process in (setup.process, setup.app):
        _stop(process)
    setup.log.close()


def _status(deployment, agent, host):
    http = deployment.client("workspace", host=host)
    answer = http.get(http.base + f"/api/v2/workspaceagents/{agent.id}", headers=agent.headers, timeout=30)
    return answer.json()["status"]


def holder_host(deployment, agent):
    """The application host whose worker holds the agent's connection (from Redis), or None."""
    value = deployment.redis("GET", f"bundle:workspace:agent:{agent.id}")
    address = value.split(" ")[0].removeprefix("tcp:").rsplit(":", 1)[0] if value else None
    return next((name for name in ("app-a", "app-b") if deployment.hosts[name].address == address), None)


def _tls_to(deployment, host):
    sock = socket.create_connection((deployment.hosts[host].address, 443), timeout=30)
    context = ssl.create_default_context(cafile=str(deployment.certificate))
    return context.wrap_socket(sock, server_hostname=f"workspace.{DOMAIN}")


def test_an_agent_serves_requests_that_reach_either_application_host(deployment, agent):
    holder = holder_host(deployment, agent)
    assert holder in ("app-a", "app-b")
    for host in ("app-a", "app-b"):
        assert _status(deployment, agent, host) == "connected"
        sock = _tls_to(deployment, host)
        try:
            assert http_on(
                sock, "GET", "/@owner/dev.main/apps/echo/hello", agent.headers, host=f"workspace.{DOMAIN}"
            ) == (200, b"hello from the app\n")
        finally:
            sock.close()
    other = "app-b" if holder == "app-a" else "app-a"
    terminal = websocket_on(
        _tls_to(deployment, other),
        f"/api/v2/workspaceagents/{agent.id}/pty?reconnect={uuid.uuid4()}",
        agent.headers,
        host=f"workspace.{DOMAIN}",
    )
    try:
        terminal.send(json.dumps({"data": "echo two-$((20+22))-hosts\r"}))
        seen = b""
        while b"two-42-hosts" not in seen:
            seen += bytes(terminal.receive())
    finally:
        terminal.close()
    relay = deployment.in_client(
        *agent_program(),
        "relay",
        "--url",
        f"https://workspace.{DOMAIN}",
        "--agent",
        agent.id,
        "app",
        "echo",
        "/hello",
        env={"WORKSPACE_SESSION_TOKEN": agent.token},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = relay.communicate(timeout=60)
    assert relay.returncode == 0 and out == b"hello from the app\n", err.decode()


# --------------------------------------------------------------------------- a host powered off


class WizardStream:
    """An /api/events stream through the front that reconnects when its connection ends
    or stays silent past the keepalives, as a page does; the collections it heard."""

    def __init__(self, deployment):
        self.deployment, self.heard, self.connections = deployment, [], 0
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        http = self.deployment.client("wizard")
        while not self.stopping:
            with contextlib.suppress(requests.RequestException):
                with http.get(http.base + "/api/events", stream=True, timeout=(5, 35)) as response:
                    self.connections += 1
                    for line in response.iter_lines():
                        if line.startswith(b"data:"):
                            self.heard.append(json.loads(line[5:]).get("collection"))
                        if self.stopping:
                            return
            time.sleep(0.5)  # a page's EventSource waits a moment before it reconnects


def test_an_application_host_powered_off_loses_nothing(deployment, agent):
    victim = holder_host(deployment, agent)
    survivor = "app-b" if victim == "app-a" else "app-a"
    wizard, notebook = deployment.client("wizard"), deployment.client("notebook")
    password = deployment.secrets["notebook_password"]
    notebook.headers["Authorization"] = f"Bearer {password}"
    streams = [WizardStream(deployment) for _ in range(4)]
    wait_for(lambda: all(s.connections for s in streams), "the event streams open", timeout=30)
    # A job queued on the victim's web workers while its own job worker is stopped:
    # only the survivor's job worker can run it.
    deployment.boxes[victim].run("systemctl", "stop", "bundle-worker@notebook.service")
    direct = deployment.client("notebook", host=victim)
    direct.headers["Authorization"] = f"Bearer {password}"
    notebook_id = direct.post(
        direct.base + "/notebooks", json={"name": "two hosts", "description": "x"}, timeout=30
    ).json()["id"]
    queued = direct.post(
        direct.base + "/sources",
        json={
            "type": "text",
            "notebook_id": notebook_id,
            "content": "Glaciers carve valleys.",
            "embed": False,
            "async_processing": True,
        },
        timeout=30,
    )
    assert queued.status_code == 202, queued.text
    # Writes through the front while it happens: each acknowledged one must be kept.
    blueprint = wizard.post(
        wizard.base + "/api/collections/blueprints", json={"title": "two hosts"}, timeout=30
    ).json()["id"]
    acknowledged, stop = [], threading.Event()

    def write():
        writer_http = deployment.client("wizard")
        while not stop.is_set():
            with contextlib.suppress(requests.RequestException):
                made = writer_http.post(
                    writer_http.base + "/api/collections/wizards", json={"name": "during"}, timeout=10
                )
                if made.status_code == 201:
                    acknowledged.append(made.json()["id"])

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_for(lambda: len(acknowledged) >= 5, "writes through the front", timeout=30)
    deployment.lan.cut(deployment.hosts[victim])
    cut = time.monotonic()
    try:
        http = deployment.client("workspace")

        def app_answers():
            with contextlib.suppress(requests.RequestException):
                return (
                    http.get(
                        http.base + "/@owner/dev.main/apps/echo/hello", headers=agent.headers, timeout=5
                    ).status_code
                    == 200
                    and holder_host(deployment, agent) == survivor
                )
            return False

        wait_for(app_answers, "the agent's app answering again through the front", timeout=60)
        print(f"two hosts: the app answered again {time.monotonic() - cut:.1f} s after the power-off", file=sys.stderr)
        count = len(acknowledged)
        wait_for(lambda: len(acknowledged) >= count + 5, "writes after the power-off", timeout=60)
        stop.set()
        writer.join(30)
        # New connections from here on: a kept-alive one may still lead to the lost host,
        # which the front closes after its time-out (a browser would open another).
        after = deployment.client("wizard")
        liked = after.post(after.base + "/api/likes/toggle", json={"blueprint_id": blueprint}, timeout=30).json()
        # Every stream, reconnected to the survivor when it was on the victim, hears
        # writes made after the power-off (one every 2 s until each has heard one).
        marks = [len(s.heard) for s in streams]

        def every_stream_heard_a_new_write():
            after.post(after.base + "/api/collections/blueprints", json={"title": "after"}, timeout=30)
            time.sleep(2)  # the pace of the writes, not a wait for an outcome
            return all("blueprints" in s.heard[mark:] for s, mark in zip(streams, marks))

        wait_for(every_stream_heard_a_new_write, "every stream hearing a write made after the power-off", timeout=120)
        command = notebook.base + f"/commands/{queued.json()['command_id']}"
        wait_for(
            lambda: notebook.get(command, timeout=30).json()["status"] == "completed",
            "the queued job done on the survivor",
            timeout=60,
        )
    finally:
        stop.set()
        for stream in streams:
            stream.stopping = True
        deployment.lan.restore(deployment.hosts[victim])
        deployment.boxes[victim].run("systemctl", "start", "bundle-worker@notebook.service")
    kept = set(deployment.psql("wizard", "SELECT id FROM wizards").split())
    assert set(acknowledged) <= kept, f"{len(set(acknowledged) - kept)} acknowledged writes lost"
    assert liked == {"liked": True, "likes_count": 1}
    assert deployment.psql("wizard", f"SELECT likes_count FROM blueprints WHERE id = '{blueprint}'") == "1"


def test_a_second_pull_changes_nothing_on_any_host(deployment):
    outputs = {}

    def pull(name):
        outputs[name] = deployment.boxes[name].run("bash", "/root/bootstrap.sh", check=False, timeout=900).stdout

    in_parallel(pull, deployment.boxes)
    for name, output in outputs.items():
        assert recap(output)["changed"] == "0", (name, output[-6000:])
