"""The HA data tier (the data role's data_ha, ops/README.md "An HA data tier") on staging
boxes provisioned by the real bootstrap.sh (ansible-pull), on a private network of
their own (devtools.private_network):

    data-1, data-2, data-3   PostgreSQL under Patroni (Raft), Redis and Sentinel
    app-a, app-b             every service, WEB_CONCURRENCY=2, on the tier's HA URLs
    front                    nginx balancing TCP across app-a and app-b (test_two_hosts' front)
    idp                      the stand-in OpenID provider

One deployment for the module: the data hosts pull at once, then the application hosts
(they need the tier's databases). The hosts share one secrets file, made here first.
Tests run in file order: the tier forms; the primary's host is cut off the network (no
FIN, no RST) while counted writes go on, through the front to the services and straight
to PostgreSQL; it comes back and rejoins as a standby, and the new leader backs up from a
standby; the Redis master's host likewise; a second pull changes nothing on any data host.
Figures are printed, not asserted.
"""

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import requests
import yaml

from devtools import private_network, staging
from devtools.fake_providers import FakeProviders
from devtools.waiting import wait_for
from tests.ops.test_two_hosts import OWNER, _application_vars, _certificate, _pull, _start_front, _start_idp, _stop
from tests.support.ops import group_vars, in_parallel, recap, site_session

# The application hosts serve the deployment's self-signed certificate.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "staging.test"
DATA = ("data-1", "data-2", "data-3")
APPS = ("app-a", "app-b")
GROUP_VARS = group_vars()
REPOSITORY = "/var/lib/pgbackrest"  # one folder of this machine in the three boxes: a shared disk
BASE = yaml.safe_load((ROOT / "ops/roles/base/defaults/main.yml").read_text())
SECRETS = ROOT / "ops/roles/base/files/bundle_secrets.py"


def _log(line):
    print(f"data ha: {line}", file=sys.stderr)


class Tier:
    def __init__(self, lan, hosts, boxes, pulls, secrets):
        self.lan, self.hosts, self.boxes, self.pulls, self.secrets = lan, hosts, boxes, pulls, secrets

    def address(self, name):
        return self.hosts[name].address

    def patroni(self, path="/cluster", names=DATA):
        """Patroni's REST API answer at `path` from the first of `names` that answers (JSON or None)."""
        for name in names:
            with contextlib.suppress(requests.RequestException, ValueError):
                return requests.get(f"http://{self.address(name)}:8008{path}", timeout=2).json()
        return None

    def leader(self, names=DATA):
        cluster = self.patroni(names=names) or {"members": []}
        return next((m["name"] for m in cluster["members"] if m["role"] == "leader"), None)

    def host_of(self, member):
        """The box name of a Patroni member (named after its address)."""
        return next(name for name in DATA if member == "pg-" + self.address(name).replace(".", "-"))

    def database_url(self, service):
        hosts = ",".join(f"{self.address(name)}:5432" for name in DATA)
        password = self.secrets[f"postgresql_{service}_password"]
        return f"postgresql://bundle_{service}:{password}@{hosts}/bundle_{service}?target_session_attrs=read-write"

    def redis(self, name, *command, port=6379):
        argv = ["redis-cli", "-p", str(port), "-a", self.secrets["redis_password"], "--no-auth-warning", *command]
        return self.boxes[name].run(*argv, check=False).stdout.strip()

    def redis_master(self, names=DATA):
        """The master's address as the sentinels of `names` see it (the first that answers)."""
        for name in names:
            answer = self.redis(name, "sentinel", "get-master-addr-by-name", "bundle", port=26379).split()
            if answer:
                return answer[0]
        return None

    def box_at(self, address):
        return next(name for name in DATA if self.address(name) == address)

    def client(self, service, host="front"):
        return site_session(f"{service}.{DOMAIN}", f"https://{self.address(host)}")


def _shared_secrets(folder):
    """One secrets file for every host, as the base role makes it on a data host of the tier."""
    services = GROUP_VARS["bundle_database_services"]
    wanted = {
        **BASE["base_secrets"],
        **{f"postgresql_{service}_password": "token" for service in services},
        "redis_password": "token",
        **BASE["base_data_ha_secrets"],
    }
    path = folder / "secrets.json"
    specs = [f"{name}={kind}" for name, kind in wanted.items()]
    subprocess.run([sys.executable, SECRETS, path, "ensure", *specs], check=True, capture_output=True, timeout=60)
    return path.read_text()


def _data_vars(tier_addresses, address):
    return {
        "bundle_roles": ["data"],
        "data_ha": True,
        "data_ha_hosts": tier_addresses,
        "data_listen_addresses": ["127.0.0.1", address],
        "data_allowed_networks": ["127.0.0.1/32", f"{address.rsplit('.', 1)[0]}.0/24"],
        "data_postgresql_max_connections": 400,
        "monitoring_enabled": False,
    }


def _app_vars(hosts, name, ai):
    settings = _application_vars(hosts[name], hosts["data-1"], hosts["idp"], ai)
    del settings["bundle_data_host"], settings["monitoring_listen_address"], settings["monitoring_allowed_addresses"]
    return {**settings, "bundle_data_hosts": [hosts[d].address for d in DATA], "monitoring_enabled": False}


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    reason = staging.nspawn_unavailable() or private_network.unavailable()
    if reason:
        pytest.skip(f"!!! STAGING BOXES NOT RUN: {reason} !!!")
    started = time.monotonic()
    root = staging.ensure_root(log=_log)
    work = tmp_path_factory.mktemp("data-ha")
    repo, bootstrap = staging.publish_snapshot(work)
    crt, key = _certificate(work)
    secrets_text = _shared_secrets(work)
    shared_repository = work / "pgbackrest"
    shared_repository.mkdir()
    with contextlib.ExitStack() as stack:
        lan = stack.enter_context(private_network.PrivateNetwork())
        hosts = {name: lan.add(name) for name in (*DATA, *APPS, "front", "idp")}
        ai = stack.enter_context(FakeProviders(host=lan.gateway))
        boxes = {}
        for index, name in enumerate((*DATA, *APPS)):
            # apt's and pip's caches: one per box, as they pull at the same time (apt locks its cache).
            cache = staging.CACHE / f"ha-{index}"
            cache.mkdir(parents=True, exist_ok=True)
            binds = [(cache, "/var/cache/apt/archives")] if name in DATA else [(cache, "/root/.cache/pip")]
            if name in DATA:
                binds.append((shared_repository, REPOSITORY))
            boxes[name] = stack.enter_context(
                staging.Box.boot(root, binds=binds, ro_binds=[(repo, "/srv/bundle.git")], netns=hosts[name].netns)
            )
            boxes[name].trust_host_certificates()
        _log(f"boxes booted after {time.monotonic() - started:.0f} s")
        pulls, addresses = {}, [hosts[name].address for name in DATA]
        secrets_file = [("/etc/bundle/secrets.json", secrets_text, "0600")]

        def pull_data(name):
            pulls[name] = _pull(boxes[name], _data_vars(addresses, hosts[name].address), bootstrap, secrets_file)

        in_parallel(pull_data, DATA)
        _log(f"the data hosts pulled after {time.monotonic() - started:.0f} s")
        # The application hosts' first start migrates their databases: on a tier still
        # settling (a standby not yet streaming, the synchronous one not yet named).
        wait_for(
            lambda: _formed(Tier(lan, hosts, boxes, pulls, json.loads(secrets_text))),
            "a leader, a synchronous standby and a replica streaming",
            timeout=120,
        )
        idp = _start_idp(lan, hosts["idp"], json.loads(secrets_text), work)
        stack.callback(_stop, idp)
        files = [
            *secrets_file,
            ("/etc/bundle/staging-tls/bundle.crt", crt.read_text(), "0644"),
            ("/etc/bundle/staging-tls/bundle.key", key.read_text(), "0600"),
        ]

        def pull_app(name):
            try:
                pulls[name] = _pull(boxes[name], _app_vars(hosts, name, ai), bootstrap, files)
            except staging.StagingError as error:  # with the services' own words
                journal = boxes[name].run("journalctl", "-u", "bundle@*", "-n", "80", "--no-pager", check=False)
                raise staging.StagingError(f"{error}\n{name}'s services:\n{journal.stdout[-6000:]}") from None

        in_parallel(pull_app, APPS)
        _log(f"every host pulled after {time.monotonic() - started:.0f} s")
        front = _start_front(lan, hosts["front"], [hosts["app-a"], hosts["app-b"]], work)
        stack.callback(_stop, front)
        yield Tier(lan, hosts, boxes, pulls, json.loads(secrets_text))


# --------------------------------------------------------------------------- the tier forms


def test_the_tier_forms_with_a_synchronous_standby_and_three_sentinels(tier):
    for name, output in tier.pulls.items():
        assert recap(output)["failed"] == "0", (name, output[-3000:])
    cluster = wait_for(lambda: _formed(tier), "a leader, a synchronous standby and a replica streaming", timeout=120)
    roles = sorted(member["role"] for member in cluster["members"])
    assert roles == ["leader", "replica", "sync_standby"], cluster
    leader = tier.host_of(tier.leader())
    assert requests.get(f"http://{tier.address(leader)}:8008/primary", timeout=5).status_code == 200
    for name in DATA:
        if name != leader:
            assert requests.get(f"http://{tier.address(name)}:8008/replica", timeout=5).status_code == 200
            assert requests.get(f"http://{tier.address(name)}:8008/primary", timeout=5).status_code == 503
    master = tier.redis_master()
    assert master in [tier.address(name) for name in DATA]
    info = tier.redis(tier.box_at(master), "info", "replication")
    assert "role:master" in info and "connected_slaves:2" in info, info
    for name in DATA:
        assert tier.redis(name, "sentinel", "ckquorum", "bundle", port=26379).startswith("OK 3 usable Sentinels")
    for name in APPS:
        env = tier.boxes[name].run("cat", "/etc/bundle/wizard.env").stdout
        hosts = ",".join(f"{tier.address(d)}:5432" for d in DATA)
        assert f"@{hosts}/bundle_wizard?target_session_attrs=read-write" in env
        sentinels = ",".join(f"{tier.address(d)}:26379" for d in DATA)
        assert "redis+sentinel://:" in env and f"@{sentinels}/bundle/" in env


def _formed(tier):
    """Patroni's /cluster when it has a leader, a synchronous standby and a replica, both
    streaming from the leader (its pg_stat_replication: Patroni 3.0.2 says only "running"), else None."""
    cluster = tier.patroni() or {"members": []}
    if sorted(m["role"] for m in cluster["members"]) != ["leader", "replica", "sync_standby"]:
        return None
    leader = tier.host_of(tier.leader())
    sql = "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'"
    streaming = _psql(tier, leader, sql, "postgres", check=False)  # None while the leader restarts
    standbys = {m["name"] for m in cluster["members"] if m["role"] != "leader"}
    return cluster if streaming is not None and set(streaming.split()) == standbys else None


# --------------------------------------------------------------------------- counted writes


class Writes:
    """Counted writes in threads until stop(): rows committed straight to PostgreSQL
    through the multi-host URL (the driver finds the primary), and each database
    service's creations through the front (its nginx balances the application hosts). Keeps what was
    acknowledged, and when each attempt succeeded or failed (time.monotonic())."""

    def __init__(self, tier):
        self.tier, self.stopping = tier, threading.Event()
        kinds = ("postgresql", "wizard", "notebook", "likes", "workspace") if APPS else ("postgresql",)
        self.acknowledged = {kind: [] for kind in kinds}
        self.outcomes = {kind: [] for kind in kinds}
        self.failures = {}
        with psycopg.connect(tier.database_url("wizard"), connect_timeout=10) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS ha_writes (id text PRIMARY KEY)")
        self.threads = [threading.Thread(target=self._rows, daemon=True)]
        if APPS:
            self.threads += [threading.Thread(target=self._service, args=(k,), daemon=True) for k in kinds[1:3]]
            self.threads += [threading.Thread(target=self._likes, daemon=True)]
            self.threads += [threading.Thread(target=self._workspaces, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _note(self, kind, ok, value=None, failure=None):
        self.outcomes[kind].append((time.monotonic(), ok))
        if ok:
            self.acknowledged[kind].append(value)
        else:
            self.failures[kind] = failure

    def wait(self, more, what, timeout=120):
        """Until every kind has `more` acknowledged writes past the present count."""
        counts = {kind: self.count(kind) + more for kind in self.acknowledged}
        try:
            wait_for(lambda: all(self.count(kind) >= counts[kind] for kind in counts), what, timeout=timeout)
        except TimeoutError as error:
            done = {kind: self.count(kind) for kind in counts}
            raise TimeoutError(f"{error}: acknowledged {done}, last failures {self.failures}") from None

    def _rows(self):
        conn = None
        while not self.stopping.is_set():
            value = uuid.uuid4().hex
            try:
                if conn is None or conn.closed:
                    # A host cut off sends no RST: the kernel gives up on unacknowledged data after 3 s.
                    conn = psycopg.connect(
                        self.tier.database_url("wizard"), connect_timeout=3, tcp_user_timeout=3000, autocommit=True
                    )
                conn.execute("SET statement_timeout = '5s'")
                conn.execute("INSERT INTO ha_writes VALUES (%s)", (value,))
                self._note("postgresql", True, value)
            except psycopg.Error as error:
                self._note("postgresql", False, failure=str(error)[:200])
                with contextlib.suppress(Exception):
                    conn.close()
                time.sleep(0.2)  # the pace of a retrying client, not a wait for an outcome

    def _post(self, service, path, body, headers=None):
        http = self.tier.client(service)
        if service == "notebook":
            http.headers["Authorization"] = f"Bearer {self.tier.secrets['notebook_password']}"
        return http.post(http.base + path, json=body, timeout=10, headers=headers)

    def _workspaces(self):
        """The Owner signs in (once it can), then makes workspaces."""
        token = None
        credentials = {"email": OWNER["email"], "password": self.tier.secrets["workspace_owner_password"]}
        while not self.stopping.is_set():
            ok = False
            try:
                if token is None:
                    login = self._post("workspace", "/api/v2/users/login", credentials)
                    token = login.json()["session_token"] if login.status_code in (200, 201) else None
                    if token is None:
                        self._note("workspace", False, failure=f"login {login.status_code} {login.text[:200]}")
                if token is not None:
                    body = {"name": f"ha-{uuid.uuid4().hex[:12]}", "agents": [{"name": "main", "apps": []}]}
                    headers = {"Workspace-Session-Token": token}
                    made = self._post("workspace", "/api/v2/users/me/workspaces", body, headers)
                    ok = made.status_code == 201
                    self._note(
                        "workspace", ok, made.json()["id"] if ok else None, f"{made.status_code} {made.text[:200]}"
                    )
            except requests.RequestException as error:
                self._note("workspace", False, failure=repr(error)[:200])
            if not ok:
                time.sleep(0.2)  # the pace of a retrying client

    def _service(self, service):
        path, body = {
            "wizard": ("/api/collections/wizards", {"name": "ha"}),
            "notebook": ("/notebooks", {"name": "ha", "description": "x"}),
        }[service]
        while not self.stopping.is_set():
            try:
                made = self._post(service, path, body)
                ok = made.status_code in (200, 201)
                self._note(service, ok, made.json()["id"] if ok else None, f"{made.status_code} {made.text[:200]}")
            except requests.RequestException as error:
                self._note(service, False, failure=repr(error)[:200])
            if not self.outcomes[service][-1][1]:
                time.sleep(0.2)  # the pace of a retrying client

    def _likes(self):
        """A blueprint made, then liked once; acknowledged: the blueprint whose like was."""
        while not self.stopping.is_set():
            try:
                made = self._post("wizard", "/api/collections/blueprints", {"title": "ha"})
                if made.status_code != 201:
                    self._note("likes", False, failure=f"{made.status_code} {made.text[:200]}")
                    time.sleep(0.2)  # the pace of a retrying client
                    continue
                blueprint = made.json()["id"]
                liked = self._post("wizard", "/api/likes/toggle", {"blueprint_id": blueprint})
                ok = liked.status_code == 200 and liked.json() == {"liked": True, "likes_count": 1}
                self._note("likes", ok, blueprint, f"{liked.status_code} {liked.text[:200]}")
            except requests.RequestException as error:
                self._note("likes", False, failure=repr(error)[:200])

    def count(self, kind="postgresql"):
        return len(self.acknowledged[kind])

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def refused_seconds(self, kind, since):
        """From the last success before `since` to the first success after it, or None."""
        before = [t for t, ok in self.outcomes[kind] if ok and t < since]
        after = [t for t, ok in self.outcomes[kind] if ok and t >= since]
        return after[0] - before[-1] if before and after else None


def _member(tier, name):
    """The Patroni member of box `name` (named after its address by the data role)."""
    return "pg-" + tier.address(name).replace(".", "-")


def _psql(tier, name, sql, database="bundle_wizard", check=True):
    argv = ("runuser", "-u", "postgres", "--", "psql", "-d", database, "-Atc", sql)
    done = tier.boxes[name].run(*argv, check=check)
    return done.stdout.strip() if done.returncode == 0 else None


def _check_kept(tier, writes, primary):
    """Every acknowledged write is on the new primary, and each acknowledged like counts once."""
    rows = set(_psql(tier, primary, "SELECT id FROM ha_writes").split())
    kept = {"postgresql": rows}
    if APPS:
        kept["wizard"] = set(_psql(tier, primary, "SELECT id FROM wizards").split())
        kept["notebook"] = set(
            _psql(tier, primary, "SELECT 'notebook:' || id FROM notebook", "bundle_notebook").split()
        )
        kept["workspace"] = set(_psql(tier, primary, "SELECT id FROM workspace", "bundle_workspace").split())
    for kind, ids in kept.items():
        lost = set(writes.acknowledged[kind]) - ids
        assert not lost, f"{len(lost)} of {len(writes.acknowledged[kind])} acknowledged {kind} writes lost"
    liked = writes.acknowledged.get("likes")
    if liked:
        ids = ",".join(f"'{b}'" for b in liked)
        counts = _psql(tier, primary, f"SELECT DISTINCT likes_count FROM blueprints WHERE id IN ({ids})").split()
        assert counts == ["1"], counts


def _print_figures(writes, cut, what):
    for kind in writes.acknowledged:
        refused = writes.refused_seconds(kind, cut)
        figure = f"{refused:.1f} s" if refused is not None else "none after the cut"
        failed = sum(1 for t, ok in writes.outcomes[kind] if not ok and t >= cut)
        _log(
            f"{what}: {kind} writes refused for {figure} ({failed} refused attempts, {writes.count(kind)} acknowledged)"
        )


# --------------------------------------------------------------------------- the primary's host lost


@pytest.fixture(scope="module")
def primary_cut(tier):
    """The primary's host cut off mid-writes; returns (its box, the new leader's box)."""
    old = tier.host_of(tier.leader())
    writes = Writes(tier)
    writes.wait(5, "writes before the cut")
    tier.lan.cut(tier.hosts[old])
    cut = time.monotonic()
    others = [name for name in DATA if name != old]
    try:
        member = _member(tier, old)
        new = wait_for(lambda: (leader := tier.leader(others)) != member and leader, "a new leader", timeout=120)
        _log(f"primary {old} cut off: {tier.host_of(new)} leads {time.monotonic() - cut:.1f} s later")
        writes.wait(5, "writes after the cut")
    finally:
        writes.stop()
    _print_figures(writes, cut, f"primary {old} cut off")
    return old, tier.host_of(new), writes


def test_the_primary_host_cut_off_mid_writes_loses_no_acknowledged_write(tier, primary_cut):
    old, new, writes = primary_cut
    assert new != old
    _check_kept(tier, writes, new)


def test_the_cut_host_rejoins_as_a_standby_without_an_admin(tier, primary_cut):
    old, new, _ = primary_cut
    tier.lan.restore(tier.hosts[old])
    back = time.monotonic()
    member = _member(tier, old)
    cluster = wait_for(
        lambda: tier.leader() != member and _formed(tier),
        "the old primary streaming as a standby",
        timeout=180,
    )
    _log(f"{old} back: streaming as a standby {time.monotonic() - back:.1f} s later")
    assert member in [m["name"] for m in cluster["members"] if m["role"] != "leader"]
    # WAL archiving goes on from the new leader into the one repository.
    tier.boxes[new].run("runuser", "-u", "postgres", "--", "pgbackrest", "--stanza=bundle", "check", timeout=120)
    # The backup timers' unit backs up on the leader, and skips on a standby; the leader's
    # backup copies the files from a standby, through its pgBackRest server.
    for name in (old, new):
        tier.boxes[name].run("systemctl", "start", "bundle-pg-backup@full.service", timeout=600)
    info = tier.boxes[new].run("runuser", "-u", "postgres", "--", "pgbackrest", "info", "--output=json").stdout
    backups = json.loads(info)[0]["backup"]
    _log(f"backups in the repository after a run on the standby {old} and one on the leader {new}: {len(backups)}")
    assert len(backups) == 1 and backups[0]["type"] == "full"
    log = tier.boxes[new].run("cat", "/var/log/pgbackrest/bundle-backup.log").stdout
    last_run = log[log.rindex("backup command begin") :]
    assert f"new backup label = {backups[0]['label']}" in last_run, last_run[-3000:]
    assert "replay on the standby reached" in last_run, last_run[-3000:]


# --------------------------------------------------------------------------- the Redis master's host lost


def test_the_redis_masters_host_cut_off_fails_over_and_rejoins(tier, primary_cut):
    master = tier.redis_master()
    old = tier.box_at(master)
    others = [name for name in DATA if name != old]
    # Its PostgreSQL's role too: losing the synchronous standby holds commits until Patroni names the other.
    role = next(m["role"] for m in tier.patroni()["members"] if m["name"] == _member(tier, old))
    _log(f"Redis master {old} is PostgreSQL's {role}")
    writes = Writes(tier)
    kind = "wizard" if APPS else "postgresql"
    wait_for(lambda: writes.count(kind) >= 5, "writes before the cut", timeout=60)
    tier.lan.cut(tier.hosts[old])
    cut = time.monotonic()
    try:
        new = wait_for(lambda: (m := tier.redis_master(others)) != master and m, "a new Redis master", timeout=60)
        _log(f"Redis master {old} cut off: {tier.box_at(new)} is master {time.monotonic() - cut:.1f} s later")
        count = writes.count(kind)
        wait_for(lambda: writes.count(kind) >= count + 5, "writes after the cut", timeout=120)
        assert "role:master" in tier.redis(tier.box_at(new), "info", "replication")
    finally:
        writes.stop()
        tier.lan.restore(tier.hosts[old])
    _print_figures(writes, cut, f"Redis master {old} cut off")
    wait_for(
        lambda: (
            "role:slave" in tier.redis(old, "info", "replication")
            and "master_link_status:up" in tier.redis(old, "info", "replication")
        ),
        "the old master replicating the new one",
        timeout=120,
    )
    wait_for(lambda: _formed(tier), "Patroni's three members again", timeout=180)
    _check_kept(tier, writes, tier.host_of(tier.leader()))


def test_a_second_pull_changes_nothing_on_any_data_host_after_the_failovers(tier):
    outputs = {}

    def pull(name):
        outputs[name] = tier.boxes[name].run("bash", "/root/bootstrap.sh", check=False, timeout=900).stdout

    in_parallel(pull, DATA)
    for name, output in outputs.items():
        assert recap(output)["changed"] == "0", (name, output[-6000:])
