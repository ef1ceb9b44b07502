"""A service riding through a PostgreSQL failover: the wizard on real gunicorn (gevent,
2 workers) with libpq's multi-host DATABASE_URL over a real three-member Patroni
cluster (devtools.patroni_cluster: synchronous replication to one standby), under a
load of counted writes (new blueprints, likes), its primary frozen (SIGSTOP: a host
that stops answering without closing anything), killed, then cut off the network
(frozen, its packets dropped: nothing acknowledged) mid-writes. About 80 s in all.

Checked each time: every write answered 2xx is on the new primary (the synchronous
standby had it before the answer); a refused write got the clean 503 with Retry-After,
never a 500; writes succeed again with no restart of the service; a like and its count
are never half applied; the migrations' lock and write_transaction's advisory lock still
exclude on the new primary; the old member, thawed or started again, rejoins as a
streaming replica with no command.

On loopback a frozen member's kernel still acknowledges packets: the requests in flight
on its connections wait until it thaws (Patroni then demotes it, cutting them: their
503s). A cut-off one acknowledges nothing: tcp_user_timeout and connect_timeout end
them while it is still cut off, as on a real network.
"""

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import requests

from app.common.db import WRITE_LOCK_KEY
from app.common.migrations import _lock_key
from devtools.patroni_cluster import PatroniCluster
from devtools.waiting import wait_for
from tests.support.wizard import TEST_IDENTITY, WizardClient

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
WRITERS = 4
# Long enough for a request held by a frozen primary to see its thaw and demotion.
REQUEST_SECONDS = 120


@pytest.fixture(scope="module")
def cluster():
    with PatroniCluster() as made:
        yield made


@pytest.fixture
def wizard(cluster, start_service, redis_server):
    url = cluster.new_database()
    env = {**TEST_IDENTITY, "DATABASE_URL": url, "REDIS_URL": redis_server.new_url()}
    service = start_service("wizard", workers=WORKERS, env=env)
    owner = WizardClient(service.base_url, "owner")
    target = owner.post("/api/collections/blueprints", json={"title": "liked", "is_public": True})
    assert target.status_code == 201
    return service, url, target.json()["id"]


@dataclass
class Load:
    """Counted writes from WRITERS threads: each a new blueprint or a like by a new
    user, every answer kept by what was written."""

    base_url: str
    target: str
    answers: dict[str, requests.Response | Exception] = field(default_factory=dict)
    answered_at: dict[str, float] = field(default_factory=dict)  # time.monotonic() of each answer
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, writer: int) -> None:
        session = requests.Session()
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"w{writer}-{n}"
            like = n % 2 == 0
            path = "/api/likes/toggle" if like else "/api/collections/blueprints"
            body = {"blueprint_id": self.target} if like else {"title": name}
            try:
                answer: requests.Response | Exception = session.post(
                    self.base_url + path,
                    json=body,
                    headers={"X-Wiz-Test-User": name if like else "owner", "X-Wiz-Test-Groups": ""},
                    timeout=REQUEST_SECONDS,
                )
            except requests.RequestException as error:
                answer = error
            with self.lock:
                key = ("like:" if like else "blueprint:") + name
                self.answers[key], self.answered_at[key] = answer, time.monotonic()
            if isinstance(answer, requests.Response) and answer.status_code == 503:
                # As a client should: the service says when to try again. On a new
                # connection: the server may close an idle one as the next request goes.
                session.close()
                self.stop.wait(float(answer.headers.get("Retry-After", "2")))

    def acknowledged(self) -> set[str]:
        with self.lock:
            return {k for k, a in self.answers.items() if isinstance(a, requests.Response) and a.ok}

    def refused_seconds(self) -> float:
        """From the first refused answer to the first acknowledged one after it."""
        refused = [self.answered_at[k] for k in self.refused()]
        if not refused:
            return 0.0
        later = [self.answered_at[k] for k in self.acknowledged() if self.answered_at[k] > min(refused)]
        return (min(later) if later else max(refused)) - min(refused)

    def refused(self) -> dict[str, requests.Response | Exception]:
        with self.lock:
            return {k: a for k, a in self.answers.items() if not (isinstance(a, requests.Response) and a.ok)}


def ride_through(cluster, wizard, fault, heal=None):
    """The load running, `fault` (a callable of the leader's index) played, `heal` (of
    the old leader's index) once another member leads, then the load stopped once
    writes succeed again on the new leader: (load, old, new)."""
    service, url, target = wizard
    load = Load(service.base_url, target)
    old = cluster.leader()
    with ThreadPoolExecutor(WRITERS) as pool:
        running = [pool.submit(load.run, writer) for writer in range(WRITERS)]
        try:
            wait_for(lambda: len(load.acknowledged()) >= 20, "writes before the fault", timeout=60)
            fault(old)
            new = cluster.wait_for_leader(other_than=old)
            before = len(load.acknowledged())
            if heal is not None:
                heal(old)
            # Writes succeed again, the service untouched.
            wait_for(lambda: len(load.acknowledged()) >= before + 20, "writes after the failover", timeout=120)
        finally:
            load.stop.set()
        for writer in running:
            writer.result(timeout=REQUEST_SECONDS + 10)
    return load, old, new


def check_writes(cluster, wizard, load, new):
    """What the load saw against what the new primary holds."""
    service, url, target = wizard
    refused = load.refused()
    assert refused, "the fault refused no write: it did not happen mid-writes"
    for name, answer in refused.items():
        assert isinstance(answer, requests.Response), f"{name}: no answer ({answer})"
        assert answer.status_code == 503, f"{name}: {answer.status_code} {answer.text[:300]}"
        assert answer.headers["Retry-After"] == "2"
        assert answer.json()["error"] == "the database is unavailable; try again shortly"
    acknowledged = load.acknowledged()
    with psycopg.connect(cluster.member_url(new, url.rsplit("/", 1)[1]), autocommit=True) as peek:
        titles = {row[0] for row in peek.execute("SELECT data::json ->> %s FROM blueprints", ("title",))}
        likers = {row[0] for row in peek.execute("SELECT user_id FROM likes WHERE blueprint_id = %s", (target,))}
        count = peek.execute("SELECT likes_count FROM blueprints WHERE id = %s", (target,)).fetchone()[0]
    assert {k.split(":", 1)[1] for k in acknowledged if k.startswith("blueprint:")} <= titles
    liked = {k.split(":", 1)[1] for k in acknowledged if k.startswith("like:")}
    assert liked <= likers  # a refused like may have committed (its answer lost): never the reverse
    assert likers <= {k.split(":", 1)[1] for k in load.answers if k.startswith("like:")}
    assert count == len(likers)  # the like and its count: one transaction, never half applied
    return refused


def test_a_frozen_primary_costs_clean_503s_then_writes_go_on_and_it_rejoins(cluster, wizard):
    # Thawed once another member leads: on loopback its kernel acknowledged the
    # requests' packets, so they wait for the thaw (and its demotion, which cuts them).
    load, old, new = ride_through(cluster, wizard, cluster.freeze_member, heal=cluster.thaw_member)
    refused = check_writes(cluster, wizard, load, new)
    print(
        f"frozen primary: {len(load.acknowledged())} writes acknowledged, {len(refused)} refused (503),"
        f" writes refused for {load.refused_seconds():.1f} s"
    )
    cluster.wait_streaming(old)  # thawed, demoted, rewound: a replica again, no command given
    assert {m["name"]: m["role"] for m in cluster.cluster()}[cluster.members[old].name] in ("replica", "sync_standby")
    locks_hold_on_the_new_primary(cluster, wizard, new)


def test_a_killed_primary_costs_clean_503s_then_writes_go_on_and_it_rejoins(cluster, wizard):
    cluster.wait_healthy()  # a synchronous standby to promote (the last test's rejoin settled)
    load, old, new = ride_through(
        cluster, wizard, cluster.kill_member, heal=lambda old: cluster.start_member(old, wait=False)
    )
    refused = check_writes(cluster, wizard, load, new)
    print(
        f"killed primary: {len(load.acknowledged())} writes acknowledged, {len(refused)} refused (503),"
        f" writes refused for {load.refused_seconds():.1f} s"
    )
    cluster.wait_streaming(old)


def waiting_on_advisory_lock(url):
    with psycopg.connect(url, autocommit=True) as peek:
        return peek.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
        ).fetchone()[0]


def locks_hold_on_the_new_primary(cluster, wizard, new):
    """write_transaction's advisory lock, and the migrations' lock (taken by
    `contract --dry-run` as by a start), held by the test on the new primary: the
    service's write and the command wait for it, then go on."""
    service, url, target = wizard
    direct = cluster.member_url(new, url.rsplit("/", 1)[1])
    with psycopg.connect(direct) as holder, ThreadPoolExecutor(1) as pool:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
        waiting = pool.submit(
            WizardClient(service.base_url, "late").post, "/api/likes/toggle", json={"blueprint_id": target}
        )
        wait_for(lambda: waiting_on_advisory_lock(direct) == 1, "the like to wait on the write lock")
        assert not waiting.done()
        holder.commit()
        assert waiting.result(timeout=30).status_code == 200
    with psycopg.connect(direct) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("wizard"),))
        command = subprocess.Popen(
            [sys.executable, "-m", "app.wizard", "contract", "--dry-run"],
            cwd=ROOT,
            env={**os.environ, "DATA_DIR": str(service.data_dir), "DATABASE_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: waiting_on_advisory_lock(direct) == 1, "contract to wait on the migrations' lock")
        assert command.poll() is None
        holder.commit()
        out, err = command.communicate(timeout=60)
    assert command.returncode == 0, err
    assert "nothing to contract" in out


def test_a_primary_cut_off_the_network_costs_seconds_not_minutes(cluster, wizard):
    """Frozen and its packets dropped (no acknowledgement either): the requests in flight
    on its connections and the pool's pings fail after tcp_user_timeout, a new
    connection moves past it after connect_timeout (app.common.database_url), so writes
    go on while it is still cut off; let back, it rejoins."""
    cluster.wait_healthy()
    load, old, new = ride_through(cluster, wizard, cluster.cut_member)
    refused = check_writes(cluster, wizard, load, new)
    print(
        f"cut-off primary: {len(load.acknowledged())} writes acknowledged, {len(refused)} refused (503),"
        f" writes refused for {load.refused_seconds():.1f} s"
    )
    cluster.reconnect_member(old)
    cluster.wait_streaming(old)
