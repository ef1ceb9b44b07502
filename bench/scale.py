"""Scale-out benchmark: what a second worker buys on this machine. Run by hand:

    .venv/bin/python -m bench.scale            # full run
    .venv/bin/python -m bench.scale --quick    # smoke run (short segments, 200 streams)
    .venv/bin/python -m bench.scale --only throughput   # or: fanout

It starts its own Redis (devtools.redis_server) and, with --database postgresql,
its own PostgreSQL (devtools.pg_server), then:

Phase 1, throughput: a CPU-bound route of each service with 1 and then 2 gunicorn
workers (REDIS_URL set for both, as a scaled-out deployment runs), loaded by wrk
(Debian's `wrk`: one thread, C keep-alive connections, straight to gunicorn) for S
seconds per segment, in ABBA order (1, 2, 2, 1 workers) to even out drift:
  - wizard `GET /api/collections/wizards` as `Remote-User: public` (the seeded
    global wizards; the JSON list is kept as bytes per collection version, so a
    request is a version read, a lookup and the write);
  - workspace `GET /api/v2/users/me` with a session token (a token lookup, the
    user and their organizations).
It prints requests/s of each and the ratio 2 workers / 1 worker (goal: >= 1.6 on
2 CPUs; wrk shares the CPUs with the service).

Phase 2, fan-out: bench.wizard's fan-out (N SSE streams on /api/events through
nginx, W writes, each timed from before its POST to each stream's receipt) with 1
worker and then with 4 workers on Redis, in the same run; prints both p50/p99.
It asserts nothing and is never
collected as a test.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import requests  # noqa: E402

from bench import wizard as wizard_bench  # noqa: E402
from bench.common import exit_on_sigterm, fmt_ms, raise_nofile, run_header  # noqa: E402
from devtools import services  # noqa: E402
from devtools.pg_server import PostgresServer  # noqa: E402
from devtools.redis_server import RedisServer  # noqa: E402

OWNER = {"email": "owner@example.com", "username": "owner", "password": "correct horse battery"}


class Target:
    """One service started with `workers` and the request wrk sends it."""

    def __init__(self, name, root, workers, env):
        self.name, self.workers = name, workers
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-{workers}w-", dir=root))
        self.log = open(folder / "service.log", "wb")
        self.service = services.start(
            name, folder / "data", env=env, workers=workers, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.url = self.service.base_url
        if name == "wizard":
            self.path, self.headers = "/api/collections/wizards", {"Remote-User": "public"}
        else:
            token = requests.post(self.url + "/api/v2/users/first", json=OWNER, timeout=30).json()["session_token"]
            self.path, self.headers = "/api/v2/users/me", {"Workspace-Session-Token": token}
        answer = requests.get(self.url + self.path, headers=self.headers, timeout=30)
        answer.raise_for_status()

    def stop(self):
        self.service.stop()
        self.log.close()


def wrk(target, seconds, connections):
    """requests/s of one wrk segment; non-2xx answers make it fail loudly."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "--latency"]
    for name, value in target.headers.items():
        command += ["-H", f"{name}: {value}"]
    done = subprocess.run(
        command + [target.url + target.path], capture_output=True, text=True, timeout=round(seconds) + 60
    )
    if done.returncode != 0 or "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        raise RuntimeError(f"wrk against {target.name}: {done.stdout}{done.stderr}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))


def throughput(name, args, root, env_of):
    """{workers: [requests/s of each segment]} in ABBA order."""
    rates = {1: [], 2: []}
    for workers in (1, 2, 2, 1):
        target = Target(name, root, workers, env_of())
        try:
            wrk(target, args.seconds / 3, args.connections)  # warm-up
            rates[workers].append(wrk(target, args.seconds, args.connections))
        finally:
            target.stop()
        print(f"   {name}, {workers} worker(s): {rates[workers][-1]:,.0f} requests/s", flush=True)
    return rates


def run_throughput(args, root, redis_server, postgres):
    print(
        f"\n== Throughput: 1 and 2 workers, wrk with {args.connections} connections, {args.seconds:g} s "
        f"segments, database {args.database} ==",
        flush=True,
    )
    results = {}
    for name in ("wizard", "workspace"):

        def env_of(name=name):
            env = {"REDIS_URL": redis_server.new_url()}
            if name == "workspace":  # its workers carry agents' requests to each other
                env["WORKSPACE_MESH_SECRET"] = "the bench's mesh secret"
            if postgres is not None:
                env["DATABASE_URL"] = postgres.new_database()
            return env

        rates = throughput(name, args, root, env_of)
        one, two = (sum(rates[w]) / len(rates[w]) for w in (1, 2))
        results[name] = (one, two)
    return results


def run_fanout(args, root, redis_server):
    results = {}
    for workers in (1, 4):
        fan_args = argparse.Namespace(
            streams=args.streams, writes=args.writes, gap=args.gap, workers=workers, open_concurrency=100
        )
        results[workers] = wizard_bench.run_fanout(fan_args, root, env={"REDIS_URL": redis_server.new_url()})
        wizard_bench.print_fanout(results[workers], fan_args, os.cpu_count())
    return results


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per wrk segment (default 10)")
    p.add_argument("--connections", type=int, default=16, help="wrk's keep-alive connections (default 16)")
    p.add_argument("--streams", type=int, default=2000, help="SSE streams in the fan-out (default 2000)")
    p.add_argument("--writes", type=int, default=5, help="timed writes in the fan-out (default 5)")
    p.add_argument("--gap", type=float, default=1.0, help="seconds between two writes (default 1)")
    p.add_argument(
        "--database",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="the services' database in phase 1 (default sqlite; Redis either way)",
    )
    p.add_argument("--only", choices=("throughput", "fanout"))
    p.add_argument("--quick", action="store_true", help="smoke run: 2 s segments, 200 streams, 3 writes")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.streams, args.writes, args.gap = 2.0, 200, 3, 0.5
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    if shutil.which("wrk") is None:
        sys.exit("bench.scale needs wrk: apt-get install wrk")
    raise_nofile()
    print(run_header("scale-out benchmark", args.quick))
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    postgres = None
    try:
        with RedisServer() as redis_server:
            if args.database == "postgresql" and args.only != "fanout":
                postgres = PostgresServer()
            tput = run_throughput(args, root, redis_server, postgres) if args.only != "fanout" else None
            fan = run_fanout(args, root, redis_server) if args.only != "throughput" else None
    finally:
        if postgres is not None:
            postgres.close()
        shutil.rmtree(root, ignore_errors=True)
    print("\n== Summary ==")
    for name, (one, two) in (tput or {}).items():
        ratio = two / one
        print(
            f"   {name:<10} 1 worker {one:,.0f}/s, 2 workers {two:,.0f}/s: x{ratio:.2f} "
            f"({'meets' if ratio >= 1.6 else 'below'} the 1.6 goal)"
        )
    if fan:
        for workers, r in fan.items():
            print(
                f"   fan-out to {r['opened']} streams, {workers} worker(s): p50 {fmt_ms(r['p50'])}, "
                f"p99 {fmt_ms(r['p99'])} (deliveries {r['received']}/{r['expected']})"
            )


if __name__ == "__main__":
    main()
