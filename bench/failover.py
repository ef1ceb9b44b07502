"""How long a PostgreSQL failover refuses the services' writes (issue #39). Run by hand:

    .venv/bin/python -m bench.failover            # a clean stop, a frozen, a cut-off, a killed primary: 3 rounds each
    .venv/bin/python -m bench.failover --quick    # a clean stop, 1 round (smoke run)

It starts a three-member Patroni cluster on loopback (devtools.patroni_cluster: Raft
through pysyncobj, synchronous mode, ttl 10 s / loop_wait 1 s / retry_timeout 4 s),
a Redis, and the wizard on gunicorn (2 gevent workers, devtools.services.start as
production does) with libpq's multi-host DATABASE_URL over the three members. K
clients post blueprints in a closed loop (each waits for its answer; after a 503 it
waits the Retry-After the service sent, on a new connection, as a client should).

Each round plays one fault on the current primary under that load: `stop` (SIGTERM:
Patroni stops its postgres and hands the lead over), `freeze` (SIGSTOP of its Patroni
and postgres; thawed as soon as another member leads, whereupon Patroni demotes it),
`cut` (frozen, and its PostgreSQL port's packets dropped by nftables: a host cut off
the network; let back once writes go on) or `kill` (SIGKILL of both; started again
after). Per round: Patroni's failover time
(from the fault to another member answering `/primary` with 200), the seconds writes
were refused (from the fault to the answer of the first write sent after it that was
acknowledged: a write in flight as a member froze may still pass, and does not count),
and the writes answered 503 and otherwise (never expected). The round ends once the
old member streams again as a replica.

Reference (a fixed expectation, not measured here): Patroni's own acceptance tests
expect a new leader within 10 s after a clean stop and within 32 s after a kill (a
frozen or cut-off host gives nothing up either: 32 s). On loopback a frozen member's
kernel still acknowledges packets, so the writes in flight on its connections wait for
its thaw and demotion; a cut-off one acknowledges nothing, and tcp_user_timeout (5 s)
and connect_timeout (3 s, app.common.database_url) end them, as on a real network.
Prints figures; asserts nothing; never collected as a test.
"""

import argparse
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field

import requests

from devtools import services
from devtools.patroni_cluster import PatroniCluster
from devtools.redis_server import RedisServer
from devtools.waiting import wait_for

# Patroni's acceptance tests (features/*.feature): a new leader within these.
REFERENCE_SECONDS = {"stop": 10.0, "freeze": 32.0, "cut": 32.0, "kill": 32.0}
REQUEST_SECONDS = 120


@dataclass
class Writers:
    """K clients posting blueprints; each answer's (time, status) kept."""

    base_url: str
    answers: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, answered, status; 0: none)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, client: int) -> None:
        session = requests.Session()
        n = 0
        while not self.stop.is_set():
            n += 1
            sent = time.monotonic()
            try:
                status = session.post(
                    f"{self.base_url}/api/collections/blueprints",
                    json={"title": f"c{client}-{n}"},
                    headers={"X-Wiz-Test-User": "bench", "X-Wiz-Test-Groups": ""},
                    timeout=REQUEST_SECONDS,
                ).status_code
            except requests.RequestException:
                status = 0
            with self.lock:
                self.answers.append((sent, time.monotonic(), status))
            if status not in (200, 201):
                session.close()  # a new connection after the wait: gunicorn closes idle ones
                self.stop.wait(2.0)  # the service's Retry-After

    def answered_since(self, started: float) -> list[tuple[float, float, int]]:
        with self.lock:
            return [a for a in self.answers if a[1] >= started]


@dataclass
class Round:
    fault: str
    failover: float
    refused_for: float
    refused: int
    other: int


def play(cluster: PatroniCluster, writers: Writers, fault: str) -> Round:
    cluster.wait_healthy()
    old = cluster.leader()
    assert old is not None
    wait_for(lambda: writers.answered_since(time.monotonic() - 1.0), "writes flowing before the fault")
    started = time.monotonic()
    getattr(cluster, f"{fault}_member")(old)
    done = time.monotonic()  # freezing walks /proc: a write may still pass meanwhile
    cluster.wait_for_leader(other_than=old)
    failover = time.monotonic() - started
    if fault == "freeze":  # on loopback the writes in flight wait for its thaw
        cluster.thaw_member(old)

    # Writes have resumed once one sent after the fault is acknowledged.
    def resumed() -> float | None:
        return min((a for s, a, code in writers.answered_since(done) if s >= done and code == 201), default=None)

    acknowledged = wait_for(resumed, "a write sent after the fault acknowledged", timeout=120)
    bring_back(cluster, fault, old)
    seen = [(a, code) for _, a, code in writers.answered_since(started)]
    return Round(
        fault,
        failover,
        acknowledged - started,
        sum(1 for t, s in seen if s == 503 and t <= acknowledged),
        sum(1 for _, s in seen if s not in (200, 201, 503)),
    )


def bring_back(cluster: PatroniCluster, fault: str, old: int) -> None:
    """The old primary back as a streaming replica (a frozen one is thawed already)."""
    if fault == "cut":
        cluster.reconnect_member(old)
    elif fault in ("stop", "kill"):
        cluster.start_member(old, wait=False)
    cluster.wait_streaming(old)


def report(rounds: list[Round]) -> None:
    print(f"{'fault':<8}{'failover s':>12}{'writes refused s':>18}{'503s':>7}{'other':>7}{'reference s':>13}")
    for r in rounds:
        print(
            f"{r.fault:<8}{r.failover:>12.1f}{r.refused_for:>18.1f}{r.refused:>7}{r.other:>7}"
            f"{REFERENCE_SECONDS[r.fault]:>13.0f}"
        )
    for fault in dict.fromkeys(r.fault for r in rounds):
        mine = [r for r in rounds if r.fault == fault]
        print(
            f"{fault}: failover median {statistics.median(r.failover for r in mine):.1f} s,"
            f" writes refused median {statistics.median(r.refused_for for r in mine):.1f} s"
            f" (Patroni's acceptance: a new leader within {REFERENCE_SECONDS[fault]:.0f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a clean stop, one round (smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    faults = ["stop"] if args.quick else ["stop", "freeze", "cut", "kill"]
    rounds_each = 1 if args.quick else args.rounds
    with PatroniCluster() as cluster, RedisServer() as redis_server:
        env = {
            "WIZ_ALLOW_TEST_IDENTITY": "1",
            "DATABASE_URL": cluster.new_database(),
            "REDIS_URL": redis_server.new_url(),
        }
        data_dir = tempfile.mkdtemp(prefix="bench-failover-")
        service = services.start("wizard", data_dir, workers=2, env=env)
        writers = Writers(service.base_url)
        threads = [threading.Thread(target=writers.run, args=(i,), daemon=True) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        try:
            rounds = [play(cluster, writers, fault) for fault in faults for _ in range(rounds_each)]
        finally:
            writers.stop.set()
            for thread in threads:
                thread.join(timeout=REQUEST_SECONDS + 10)
            service.stop()
    print(f"{args.clients} clients post blueprints to the wizard (2 workers), 3 Patroni members, {os.cpu_count()} cpus")
    report(rounds)


if __name__ == "__main__":
    main()
