"""Workspace platform benchmark: token authentication cost and logins vs the gevent loop. Run by hand:

    .venv/bin/python -m bench.workspace            # full run (3 rounds of 5 s per route, 10 s login storms)
    .venv/bin/python -m bench.workspace --quick    # smoke run (2 rounds of 1.5 s, 4 s storms)
    .venv/bin/python -m bench.workspace --only auth    # one phase: auth or logins
    .venv/bin/python bench/workspace.py --help

It starts the workspace service itself with devtools.services.start (gunicorn, one
gevent worker by default, exactly as production), each phase on a fresh temporary
DATA_DIR, puts a real nginx in front of it (devtools.nginx.start, the production
site template; requests carry `Host: workspace.localhost`), creates the first user
(POST /api/v2/users/first) for its session token, talks to 127.0.0.1 only, prints
figures and a verdict per target, and stops nginx and the service whatever
happens. It asserts nothing and is never collected as a test.

Phase 1, auth: C keep-alive clients (default 8) send back-to-back requests for S
seconds to either `GET /api/v2/users/me` with `Workspace-Session-Token: <token>`
or `GET /healthz` (a bare route of the same process: no auth, no query; it still
pays Flask, the request log and the pooled database connect/close every request
gets). The two routes alternate, R rounds (ABBA order, to even out drift), through
nginx (the target) and then straight to gunicorn (to show what nginx adds).
requests/s, p50/p99 latency, every answer must be a 200; the ratio is
/users/me requests/s over /healthz requests/s. CPU per request of the worker,
nginx and this client is printed beside it.

Phase 2, logins: the service runs with WORKSPACE_LOGIN_RATE_PER_ADDRESS and
WORKSPACE_LOGIN_RATE_PER_ACCOUNT at 100000 (the limits would otherwise answer 429s
long before the hashing is loaded). One client samples `GET /api/v2/buildinfo`
sequentially (a pause of --probe-gap between samples) for B seconds alone (the
baseline), then during a storm of L concurrent logins (default 20 keep-alive
clients, each POSTing /api/v2/users/login back-to-back for D seconds; every answer
must be a 201). Straight to gunicorn and then through nginx, on the same service.
Each login verifies an scrypt hash (N=2^14, r=8: ~16 MB and tens of ms of CPU)
in gevent's threadpool, so the samples show whether the loop stays free.

The clients run in this process on gevent (raw sockets, a minimal HTTP/1.1
client), on the same machine as the service and nginx: they compete for the CPUs,
so the CPU of each is printed, and so is what other processes and the hypervisor
took meanwhile.

Profiling: --profile-client FILE writes cProfile stats of this process (the
client; it slows the client down) and prints its top functions; --py-spy DIR
records the (first) worker with py-spy (if installed: `.venv/bin/pip install
py-spy`) during every measured segment, one collapsed-stack file per segment
(`--threads`, so the threadpool's scrypt threads are told apart from the loop's),
and prints where the worker's samples went, as CPU per request where the loop
thread is the only busy one. py-spy pauses the worker to sample it and takes a
CPU share of its own (counted as "other", so the figures say DISTURBED): the
latencies and rates of a profiled run are not the bench's figures.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/workspace.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HOST,
    REQUEST_TIMEOUT_S,
    CpuMeter,
    KeepAliveClient,
    Service,
    build_request,
    exit_on_sigterm,
    fmt_ms,
    log_tails,
    machine_busy_seconds,
    merge_rounds,
    percentile,
    print_targets,
    raise_nofile,
    run_header,
    start_nginx,
    stop_nginx,
    timed_answers,
    verdict,
)
from devtools import nginx as devnginx  # noqa: E402

FIRST_USER = {"email": "owner@example.com", "username": "owner", "password": "correct horse battery"}
LOGIN = {"email": FIRST_USER["email"], "password": FIRST_USER["password"]}
TOKEN_HEADER = "Workspace-Session-Token"
ME = "/api/v2/users/me"
BARE = "/healthz"
BUILDINFO = "/api/v2/buildinfo"
LOGIN_PATH = "/api/v2/users/login"
LOGIN_LIMITS = {"WORKSPACE_LOGIN_RATE_PER_ADDRESS": "100000", "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "100000"}

# Targets (from the issue).
TARGET_RATIO = 0.7
TARGET_BUILDINFO_P99_S = 0.050
TARGET_LOGINS = 20

# Bounds: every wait below has one of these.
MAX_REQUESTS = 10_000_000  # per client and segment
MAX_RECONNECTS = 20  # per client and segment
PY_SPY_SLACK_S = 15.0  # py-spy's own start and write-out, past its duration


# --------------------------------------------------------------------------- helpers


def fmt_us(seconds):
    return "-" if seconds is None else f"{seconds * 1e6:.0f} us"


class Stack:
    """The service, and nginx in front of it, started together and stopped together."""

    def __init__(self, root, name, workers, env=None):
        data_dir = root / f"{name}-data"
        data_dir.mkdir()
        self.proxy = None
        self.service = Service("workspace", data_dir, root / f"{name}-service.log", workers=workers, env=env)
        try:
            self.proxy, self.proxy_pids = start_nginx(root / f"{name}-nginx", "workspace", self.service)
        except BaseException:
            self.stop()
            raise
        self.worker_pids = self.service.worker_pids
        # (label, port, Host header) of each way in.
        self.routes = {
            "nginx": (self.proxy.port, self.proxy.host("workspace")),
            "direct": (self.service.port, f"{HOST}:{self.service.port}"),
        }

    def meter(self, way):
        """A CpuMeter of the workers, and of nginx's processes when `way` is nginx."""
        return CpuMeter(self.worker_pids, self.proxy_pids if way == "nginx" else ())

    def stop(self):
        try:
            if self.proxy is not None:
                proxy, self.proxy = self.proxy, None
                stop_nginx(proxy)
        finally:
            self.service.stop()

    def log_tails(self):
        return log_tails(self.service, self.proxy)


def create_first_user(port, host):
    client = KeepAliveClient(port, host)
    try:
        answer = client.json("POST", "/api/v2/users/first", FIRST_USER, expect=(201,))
        me = client.json("GET", ME, headers={TOKEN_HEADER: answer["session_token"]}, expect=(200,))
        if me.get("username") != FIRST_USER["username"]:
            raise RuntimeError(f"/users/me answered {me!r} for the first user's token")
        return answer["session_token"]
    finally:
        client.close()


class PySpy:
    """Optional (--py-spy DIR): py-spy recording the worker during each measured
    segment, one collapsed-stack file per segment; segments of one `group` (a route
    and way, all rounds) are summarized together, with the worker's CPU per request
    measured over the same segments."""

    def __init__(self, directory, binary):
        self.directory, self.binary = directory, binary
        self.process = None
        self.groups = {}  # group -> {"files": [...], "cpu": s, "count": n}

    def start(self, pid, seconds, group, name):
        if self.directory is None:
            return
        out = self.directory / f"{name}.txt"
        self.process = subprocess.Popen(
            [
                self.binary,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, math.ceil(seconds))),
                "--rate",
                "250",
                "--threads",
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.groups.setdefault(group, {"files": [], "cpu": 0.0, "count": 0})["files"].append(out)
        gevent.sleep(0.5)  # attaching

    def wait(self, seconds, group=None, worker_cpu=0.0, count=0):
        """Wait (bounded) for the recording to be written; account the segment's worker CPU."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if group in self.groups:
            self.groups[group]["cpu"] += worker_cpu
            self.groups[group]["count"] += count
        try:
            _, err = process.communicate(timeout=seconds + PY_SPY_SLACK_S)
            if process.returncode != 0:
                print(f"   py-spy failed ({process.returncode}): {err.decode(errors='replace')[-500:]}")
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            print("   py-spy did not finish in time; killed")

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
        self.process = None


# --------------------------------------------------------------------------- load


def run_clients(port, raw, clients, seconds, meter, setup=None, started=None):
    """`clients` keep-alive clients sending `raw` back-to-back for `seconds` (each
    finishes the request it has in flight at the deadline). `setup()` runs just
    before the meter starts, `started()` just after the clients are released.
    Returns {count, seconds, rate, latencies, statuses, errors, bad, cpu, stragglers}."""
    latencies, statuses, errors, bad = [], Counter(), Counter(), Counter()
    start = Event()
    state = {"deadline": None}

    def worker(client):
        start.wait()
        for status, _, content in timed_answers(
            client, lambda: client.send(raw), state["deadline"], latencies, errors, MAX_REQUESTS, MAX_RECONNECTS
        ):
            statuses[status] += 1
            if status not in (200, 201) and len(bad) < 20:
                bad[f"{status}: {content[:200]!r}"] += 1

    pool, greenlets = [], []
    try:
        for _ in range(clients):
            client = KeepAliveClient(port)
            client.connect()
            pool.append(client)
        greenlets = [gevent.spawn(worker, c) for c in pool]
        gevent.sleep(0.1)  # every greenlet waits on `start`
        if setup is not None:
            setup()
        meter.start()
        state["deadline"] = time.perf_counter() + seconds
        start.set()
        if started is not None:
            started()
        gevent.joinall(greenlets, timeout=seconds + REQUEST_TIMEOUT_S + 5)
        meter.stop()
        stragglers = sum(1 for g in greenlets if not g.dead)
    finally:
        gevent.killall(greenlets, timeout=5)
        for client in pool:
            client.close()
    count = len(latencies)
    return {
        "count": count,
        "seconds": meter.seconds,
        "rate": count / meter.seconds if meter.seconds else 0.0,
        "latencies": latencies,
        "statuses": statuses,
        "errors": errors,
        "bad": bad,
        "cpu": meter,
        "stragglers": stragglers,
    }


def merge(segments):
    """One route's segments (rounds) as one figure."""
    figure = merge_rounds(segments)
    figure.update(
        all_200=figure["all_ok"],
        disturbed=bool(figure["disturbed_rounds"]),
        other_share=figure["other_share"] + figure["steal_share"],
    )  # printed as other+steal
    return figure


# --------------------------------------------------------------------------- phase 1: auth


def run_auth(args, root, spy):
    print(
        f"\n== Auth: {args.clients} keep-alive clients, {args.rounds} rounds x {args.seconds:g} s per route "
        f"and way, {args.workers} gevent worker(s) ==",
        flush=True,
    )
    stack = Stack(root, "auth", args.workers)
    try:
        print(
            f"   service on {HOST}:{stack.service.port} (worker pids {stack.worker_pids}), nginx on "
            f"{HOST}:{stack.proxy.port} (pids {stack.proxy_pids}), Host {stack.proxy.host('workspace')}",
            flush=True,
        )
        token = create_first_user(*stack.routes["direct"])
        results = {}
        for way in args.ways:
            port, host = stack.routes[way]
            raws = {BARE: build_request("GET", BARE, host), ME: build_request("GET", ME, host, {TOKEN_HEADER: token})}
            # Warm-up (not counted): first-request costs, the connection pools (the database's,
            # nginx's upstream keepalive).
            for _path, raw in raws.items():
                run_clients(port, raw, args.clients, min(1.0, args.seconds), stack.meter(way))
            segments = {BARE: [], ME: []}
            for r in range(args.rounds):
                order = (BARE, ME) if r % 2 == 0 else (ME, BARE)
                for path in order:
                    group = f"auth-{way}-{'me' if path == ME else 'healthz'}"
                    segment = run_clients(
                        port,
                        raws[path],
                        args.clients,
                        args.seconds,
                        stack.meter(way),
                        setup=lambda group=group, r=r: spy.start(
                            stack.worker_pids[0], args.seconds, group, f"{group}-r{r + 1}"
                        ),
                    )
                    spy.wait(args.seconds, group, segment["cpu"].worker, segment["count"])
                    segments[path].append(segment)
                    print(
                        f"   {way:<6} round {r + 1} {path:<16} {segment['rate']:7.0f} req/s  "
                        f"p50 {fmt_ms(percentile(segment['latencies'], 50))}  "
                        f"p99 {fmt_ms(percentile(segment['latencies'], 99))}  "
                        f"answers {dict(segment['statuses'])}"
                        + (f"  errors {sum(segment['errors'].values())}" if segment["errors"] else ""),
                        flush=True,
                    )
            bare, me = merge(segments[BARE]), merge(segments[ME])
            rounds = [m["rate"] / b["rate"] for b, m in zip(segments[BARE], segments[ME]) if b["rate"]]
            results[way] = {
                "bare": bare,
                "me": me,
                "ratio": me["rate"] / bare["rate"] if bare["rate"] else None,
                "round_ratios": rounds,
            }
        return results
    except BaseException:
        print(stack.log_tails(), file=sys.stderr)
        raise
    finally:
        spy.stop()
        stack.stop()


def print_route(label, r):
    print(
        f"   {label:<22} {r['rate']:7.0f} req/s (rounds "
        + ", ".join(f"{x:.0f}" for x in r["rates"])
        + f"), p50 {fmt_ms(r['p50'])}, p99 {fmt_ms(r['p99'])}, max {fmt_ms(r['max'])}; "
        f"{r['count']} answers {dict(r['statuses'])}"
        + (f", transport errors {sum(r['errors'].values())}" if r["errors"] else "")
        + (f", clients still running at the bound {r['stragglers']}" if r["stragglers"] else "")
    )
    print(
        f"   {'':<22} CPU per request: worker {fmt_us(r['worker_per_req'])}"
        + (f", nginx {fmt_us(r['proxy_per_req'])}" if r["proxy_share"] else "")
        + f", bench client {fmt_us(r['client_per_req'])}; share of one CPU: worker {r['worker_share'] * 100:.0f}%"
        + (f", nginx {r['proxy_share'] * 100:.0f}%" if r["proxy_share"] else "")
        + f", client {r['client_share'] * 100:.0f}%, other+steal {r['other_share'] * 100:.0f}%"
    )
    for what, count in (r["bad"] + r["errors"]).most_common(5):
        print(f"     {count} x {what}")


def print_auth(results, ncpu):
    print(
        f"\n-- Auth results (one gevent worker unless --workers; client, nginx and service share this "
        f"{ncpu}-CPU machine) --"
    )
    for way, r in results.items():
        print(f"   {'through nginx' if way == 'nginx' else 'straight to gunicorn'}:")
        print_route(f"GET {BARE}", r["bare"])
        print_route(f"GET {ME} (token)", r["me"])
        if r["ratio"] is not None:
            print(
                f"   {'ratio me/healthz':<22} {r['ratio']:.2f} (per round: "
                + ", ".join(f"{x:.2f}" for x in r["round_ratios"])
                + ")"
            )
            per = r["me"]["worker_per_req"], r["bare"]["worker_per_req"]
            if None not in per:
                print(
                    f"   {'auth cost in the worker':<22} {fmt_us(per[0] - per[1])} of CPU per request more "
                    f"than the bare route ({fmt_us(per[0])} vs {fmt_us(per[1])})"
                )


# --------------------------------------------------------------------------- phase 2: logins


def sample(port, raw, seconds, gap):
    """Sequential samples of `raw` on one keep-alive connection for `seconds`:
    (latencies, statuses, errors)."""
    client = KeepAliveClient(port)
    latencies, statuses, errors = [], Counter(), Counter()
    try:
        client.connect()
        for status, _, _ in timed_answers(
            client,
            lambda: client.send(raw),
            time.perf_counter() + seconds,
            latencies,
            errors,
            MAX_REQUESTS,
            MAX_RECONNECTS,
        ):
            statuses[status] += 1
            if gap:
                gevent.sleep(gap)
    finally:
        client.close()
    return latencies, statuses, errors


def probe_figures(latencies, statuses, errors, seconds):
    return {
        "count": len(latencies),
        "rate": len(latencies) / seconds if seconds else 0.0,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies) if latencies else None,
        "over": sum(1 for x in latencies if x > TARGET_BUILDINFO_P99_S),
        "statuses": statuses,
        "errors": errors,
        "all_200": bool(latencies) and set(statuses) == {200} and not errors,
    }


def run_logins(args, root, spy):
    print(
        f"\n== Logins: {args.logins} concurrent logins for {args.storm_seconds:g} s while one client samples "
        f"{BUILDINFO} (pause {args.probe_gap * 1000:g} ms between samples), {args.workers} gevent worker(s) ==",
        flush=True,
    )
    stack = Stack(root, "logins", args.workers, env=LOGIN_LIMITS)
    try:
        print(
            f"   service on {HOST}:{stack.service.port} (worker pids {stack.worker_pids}), nginx on "
            f"{HOST}:{stack.proxy.port}; login limits per address and account: 100000/min",
            flush=True,
        )
        create_first_user(*stack.routes["direct"])
        results = {}
        for way in args.ways:
            port, host = stack.routes[way]
            probe = build_request("GET", BUILDINFO, host)
            login = build_request("POST", LOGIN_PATH, host, body=LOGIN)
            # Warm-up: one login, a few samples.
            warm = KeepAliveClient(port, host)
            try:
                warm.json("POST", LOGIN_PATH, LOGIN, expect=(201,))
            finally:
                warm.close()
            sample(port, probe, 0.5, args.probe_gap)

            spy.start(stack.worker_pids[0], args.baseline_seconds, f"logins-{way}-baseline", f"logins-{way}-baseline")
            meter = stack.meter(way).start()
            base = sample(port, probe, args.baseline_seconds, args.probe_gap)
            meter.stop()
            baseline = probe_figures(*base, meter.seconds)
            spy.wait(args.baseline_seconds, f"logins-{way}-baseline", meter.worker, baseline["count"])
            baseline["cpu"] = meter
            print(
                f"   {way:<6} baseline: {BUILDINFO} p50 {fmt_ms(baseline['p50'])}, p99 {fmt_ms(baseline['p99'])}, "
                f"max {fmt_ms(baseline['max'])} ({baseline['count']} samples)",
                flush=True,
            )

            # The sampler starts with the logins and stops at their deadline (the logins
            # then in flight finish afterwards, unsampled).
            sampled, probe_greenlet = {}, []

            def sampler(port=port, probe=probe, sampled=sampled):
                sampled["result"] = sample(port, probe, args.storm_seconds, args.probe_gap)

            storm = run_clients(
                port,
                login,
                args.logins,
                args.storm_seconds,
                stack.meter(way),
                setup=lambda way=way: spy.start(
                    stack.worker_pids[0], args.storm_seconds, f"logins-{way}-storm", f"logins-{way}-storm"
                ),
                started=lambda probe_greenlet=probe_greenlet: probe_greenlet.append(gevent.spawn(sampler)),
            )
            if probe_greenlet:
                probe_greenlet[0].join(timeout=REQUEST_TIMEOUT_S + 5)
                probe_greenlet[0].kill(timeout=5)
            spy.wait(args.storm_seconds, f"logins-{way}-storm", storm["cpu"].worker, storm["count"])
            during = probe_figures(
                *sampled.get("result", ([], Counter(), Counter({"the sampler died": 1}))),
                min(args.storm_seconds, storm["seconds"]),
            )
            storm_fig = merge([storm])
            print(
                f"   {way:<6} storm:    {BUILDINFO} p50 {fmt_ms(during['p50'])}, p99 {fmt_ms(during['p99'])}, "
                f"max {fmt_ms(during['max'])} ({during['count']} samples); logins {storm_fig['rate']:.1f}/s, "
                f"p50 {fmt_ms(storm_fig['p50'])}, p99 {fmt_ms(storm_fig['p99'])}, answers "
                f"{dict(storm_fig['statuses'])}",
                flush=True,
            )
            results[way] = {"baseline": baseline, "during": during, "storm": storm_fig, "cpu": storm["cpu"]}
        return results
    except BaseException:
        print(stack.log_tails(), file=sys.stderr)
        raise
    finally:
        spy.stop()
        stack.stop()


def print_logins(results, logins, ncpu):
    print(
        f"\n-- Login results ({logins} concurrent logins; client, nginx and service share this {ncpu}-CPU machine) --"
    )
    for way, r in results.items():
        b, d, s, cpu = r["baseline"], r["during"], r["storm"], r["cpu"]
        print(f"   {'through nginx' if way == 'nginx' else 'straight to gunicorn'}:")
        print(
            f"     {BUILDINFO}, no logins:  p50 {fmt_ms(b['p50'])}, p99 {fmt_ms(b['p99'])}, max {fmt_ms(b['max'])} "
            f"({b['count']} samples, {dict(b['statuses'])})"
        )
        print(
            f"     {BUILDINFO}, {logins} logins: p50 {fmt_ms(d['p50'])}, p99 {fmt_ms(d['p99'])}, "
            f"max {fmt_ms(d['max'])} ({d['count']} samples, {d['over']} over "
            f"{TARGET_BUILDINFO_P99_S * 1000:.0f} ms, {dict(d['statuses'])}"
            + (f", errors {sum(d['errors'].values())}" if d["errors"] else "")
            + ")"
        )
        print(
            f"     logins:                 {s['count']} in {s['seconds']:.1f} s -> {s['rate']:.1f}/s, "
            f"p50 {fmt_ms(s['p50'])}, p99 {fmt_ms(s['p99'])}, max {fmt_ms(s['max'])}; answers "
            f"{dict(s['statuses'])}" + (f", transport errors {sum(s['errors'].values())}" if s["errors"] else "")
        )
        for what, count in (s["bad"] + s["errors"] + d["errors"]).most_common(5):
            print(f"       {count} x {what}")
        print(
            f"     CPU during the storm:   worker (loop + threadpool) {cpu.pct(cpu.worker)} of one CPU "
            f"({fmt_ms(cpu.worker / s['count'] if s['count'] else None)} per login)"
            + (f", nginx {cpu.pct(cpu.proxy)}" if cpu.proxy else "")
            + f", bench client {cpu.pct(cpu.client)}, other {cpu.pct(cpu.other)}, steal {cpu.pct(cpu.steal)}"
        )


# --------------------------------------------------------------------------- py-spy summary

# (label, frame as py-spy names it, without its line number). A stack counts once per
# label however many times the frame appears in it (inclusive share).
SPY_FRAMES = [
    ("gunicorn: parse request, call app, write", "AsyncWorker.handle_request (gunicorn/workers/base_async.py)"),
    ("  gunicorn: parse the request", "Parser.__next__ (gunicorn/http/parser.py)"),
    ("  gunicorn: write the response", "Response.write (gunicorn/http/wsgi.py)"),
    ("  flask: wsgi_app", "Flask.wsgi_app (flask/app.py)"),
    ("    before_request: db connect (pool)", "init_app.<locals>.connect (app/workspace/__init__.py)"),
    ("    after_request: request log line", "register.<locals>.log_request (app/common/requestlog.py)"),
    ("    teardown: db close (pool)", "init_app.<locals>.disconnect (app/workspace/__init__.py)"),
    ("    view /users/me", "me (app/workspace/routes/api.py)"),
    ("      sessions.authenticate", "authenticate (app/workspace/access/sessions.py)"),
    ("      accounts.public", "public (app/workspace/access/accounts.py)"),
    ("    view /users/login", "login (app/workspace/routes/api.py)"),
    ("      verify_password (waits: threadpool)", "verify_password (app/workspace/access/passwords.py)"),
    ("      sessions.mint", "mint (app/workspace/access/sessions.py)"),
    ("      audit", "audit (app/workspace/core/models.py)"),
    ("    view /buildinfo", "buildinfo (app/workspace/routes/api.py)"),
    ("peewee: build SQL (Context.sql)", "Context.sql (peewee.py)"),
    ("peewee: sqlite3 execute", "Database._execute_cursor (peewee.py)"),
    ("peewee: rows -> models", "CursorWrapper.iterate (peewee.py)"),
    ("scrypt (threadpool threads)", "_scrypt (app/workspace/access/passwords.py)"),
]
_LINE = re.compile(r":\d+\)$")
# An idle threadpool thread waiting for a task (py-spy counts it as active).
_IDLE_POOL = "Queue.get (gevent/_threading.py);_Condition.wait (gevent/_threading.py)"


def summarize_py_spy(groups, top=10):
    """Where the worker's samples went, per group of segments: per thread, inclusive
    shares of the frames that matter for the targets and, when the worker's CPU per
    request was measured, those shares as CPU per request (an approximation: py-spy
    samples a thread that is running or runnable)."""
    for group, info in groups.items():
        total, threads, inclusive, leaf = 0, Counter(), Counter(), Counter()
        for path in info["files"]:
            try:
                lines = Path(path).read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                stack, _, count = line.rpartition(" ")
                try:
                    n = int(count)
                except ValueError:
                    continue
                frames = [_LINE.sub(")", f) for f in stack.split(";")]
                if _IDLE_POOL in ";".join(frames):
                    continue
                total += n
                threads[frames[0]] += n
                present = set(frames)
                for label, frame in SPY_FRAMES:
                    if frame in present:
                        inclusive[label] += n
                leaf[frames[-1]] += n
        if not total:
            print(f"   {group}: no samples")
            continue
        per = info["cpu"] / info["count"] if info["count"] else None
        if threads.most_common(1)[0][1] < 0.95 * total:
            per = None  # several busy threads (the threadpool's): samples are not CPU time then
        print(
            f"   {group}: {total} samples in {len(info['files'])} recording(s)"
            + (f"; worker CPU {fmt_us(per)} per request" if per is not None else "")
        )
        for thread, n in threads.most_common(3):
            print(f"     {thread[:40]:<44} {n / total * 100:5.1f}% of the samples")
        for label, _ in SPY_FRAMES:
            if inclusive[label]:
                share = inclusive[label] / total
                print(
                    f"     incl. {label:<44} {share * 100:5.1f}%"
                    + (f"  ~{fmt_us(share * per)}/request" if per is not None else "")
                )
        for frame, n in leaf.most_common(top):
            print(f"     self  {frame[:80]:<80} {n / total * 100:5.1f}%")


# --------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.workspace",
        description="Workspace platform benchmark: token-authenticated /users/me vs a bare route through nginx, "
        "and /buildinfo latency during a login storm. Prints figures; asserts nothing.",
    )
    p.add_argument("--clients", type=int, default=8, help="concurrent keep-alive clients for phase 1 (default 8)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per route and round in phase 1 (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of (healthz, me) in phase 1, ABBA (default 3)")
    p.add_argument(
        "--logins", type=int, default=TARGET_LOGINS, help=f"concurrent logins in phase 2 (default {TARGET_LOGINS})"
    )
    p.add_argument("--storm-seconds", type=float, default=10.0, help="duration of each login storm (default 10)")
    p.add_argument(
        "--baseline-seconds",
        type=float,
        default=5.0,
        help="duration of the /buildinfo baseline without logins (default 5)",
    )
    p.add_argument(
        "--probe-gap", type=float, default=0.005, help="pause between two /buildinfo samples, seconds (default 0.005)"
    )
    p.add_argument("--workers", type=int, default=1, help="gunicorn workers (default 1)")
    p.add_argument(
        "--way",
        choices=("both", "nginx", "direct"),
        default="both",
        help="through nginx, straight to gunicorn, or both (default; nginx first)",
    )
    p.add_argument("--only", choices=("auth", "logins"), help="run one phase only")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 2 rounds of 1.5 s per route, 4 s storms, 2 s baselines"
    )
    p.add_argument(
        "--profile-client",
        metavar="FILE",
        help="cProfile this process (the bench client) into FILE and print its top functions",
    )
    p.add_argument(
        "--py-spy",
        metavar="DIR",
        help="record the worker with py-spy (collapsed stacks, one file per segment) into DIR and "
        "summarize them; needs py-spy (.venv/bin/pip install py-spy)",
    )
    p.add_argument("--tmp-dir", help="parent of the temporary DATA_DIRs (default: the system's, /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (data, logs, nginx prefix)")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.storm_seconds, args.baseline_seconds = 1.5, 2, 4.0, 2.0
    for name in ("clients", "rounds", "logins", "workers"):
        if not 1 <= getattr(args, name) <= 1000:
            p.error(f"--{name.replace('_', '-')} must be between 1 and 1000")
    for name in ("seconds", "storm_seconds", "baseline_seconds"):
        if not 0 < getattr(args, name) <= 600:
            p.error(f"--{name.replace('_', '-')} must be in (0, 600]")
    if not 0 <= args.probe_gap <= 1:
        p.error("--probe-gap must be in [0, 1]")
    args.ways = ("nginx", "direct") if args.way == "both" else (args.way,)
    return args


def find_py_spy():
    for candidate in (ROOT / ".venv" / "bin" / "py-spy", shutil.which("py-spy")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def main(argv=None):
    args = parse_args(argv)

    exit_on_sigterm()
    try:
        devnginx.nginx_binary()
    except devnginx.NginxError as exc:
        sys.exit(str(exc))
    spy_dir = None
    if args.py_spy:
        binary = find_py_spy()
        if binary is None:
            sys.exit("--py-spy: py-spy is not installed (.venv/bin/pip install py-spy)")
        spy_dir = Path(args.py_spy)
        spy_dir.mkdir(parents=True, exist_ok=True)
    spy = PySpy(spy_dir, binary if spy_dir else None)
    profiler = None
    if args.profile_client:
        import cProfile

        profiler = cProfile.Profile()

    ncpu = os.cpu_count()
    soft, hard = raise_nofile()
    root = Path(tempfile.mkdtemp(prefix="bench-workspace-", dir=args.tmp_dir))
    nginx_version = subprocess.run(
        [devnginx.nginx_binary(), "-v"], capture_output=True, text=True, timeout=10
    ).stderr.strip()
    print(f"{run_header('workspace platform benchmark', args.quick)}, {nginx_version}")
    print(
        f"temporary DATA_DIRs and nginx prefixes under {root}; bench client: gevent, raw sockets, "
        f"RLIMIT_NOFILE {soft}/{hard}; it runs on the same {ncpu} CPUs as nginx and the service"
    )
    auth = logins = None
    steal0, t_run = machine_busy_seconds()[1], time.perf_counter()
    try:
        if profiler is not None:
            profiler.enable()
        if args.only in (None, "auth"):
            auth = run_auth(args, root, spy)
            print_auth(auth, ncpu)
        if args.only in (None, "logins"):
            logins = run_logins(args, root, spy)
            print_logins(logins, args.logins, ncpu)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_client)
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    if profiler is not None:
        import pstats

        print(f"\n== Bench client profile ({args.profile_client}), top functions by own time ==")
        pstats.Stats(args.profile_client).sort_stats("tottime").print_stats(12)
    if spy.groups:
        print(f"\n== py-spy recordings of the worker ({spy_dir}; idle threadpool threads left out) ==")
        print("   (py-spy pauses the worker to sample it: latencies measured with --py-spy are inflated)")
        summarize_py_spy(spy.groups)

    steal, t_run = machine_busy_seconds()[1] - steal0, time.perf_counter() - t_run
    print(f"\n== Summary ({'quick smoke run' if args.quick else 'full run'}) ==")
    print(
        f"   CPU stolen by the hypervisor over the whole run: {steal:.2f} s in {t_run:.0f} s "
        f"({steal / t_run * 100 / ncpu:.1f}% of the {ncpu} CPUs)"
    )
    rows, verdicts = [], []
    if auth:
        for way, r in auth.items():
            ok = r["ratio"] is not None and r["ratio"] >= TARGET_RATIO and r["bare"]["all_200"] and r["me"]["all_200"]
            label = "via nginx" if way == "nginx" else "direct"
            rows.append(
                (
                    f"/users/me / /healthz req/s, {label}",
                    f"{r['me']['rate']:.0f} / {r['bare']['rate']:.0f} = {r['ratio'] or 0:.2f}; p99 "
                    f"{fmt_ms(r['me']['p99'])} / {fmt_ms(r['bare']['p99'])}; all 200: "
                    f"{'yes' if r['bare']['all_200'] and r['me']['all_200'] else 'NO'}"
                    + ("; DISTURBED by other processes" if r["bare"]["disturbed"] or r["me"]["disturbed"] else ""),
                    f">= {TARGET_RATIO}, all 200" if way == "nginx" else "(figure only)",
                    ok if way == "nginx" else None,
                )
            )
            if way == "nginx":
                verdicts.append(
                    f"TARGET 1 token-authenticated /users/me through nginx >= {TARGET_RATIO} x the bare "
                    f"route's requests/s ({args.clients} clients, {args.workers} worker(s)): "
                    f"{verdict(ok)} (ratio {r['ratio'] or 0:.2f})"
                )
    if logins:
        for way, r in logins.items():
            d = r["during"]
            logins_ok = r["storm"]["count"] > 0 and set(r["storm"]["statuses"]) == {201} and not r["storm"]["errors"]
            ok = d["p99"] is not None and d["p99"] < TARGET_BUILDINFO_P99_S and d["all_200"] and logins_ok
            label = "via nginx" if way == "nginx" else "direct"
            rows.append(
                (
                    f"/buildinfo p99 during {args.logins} logins, {label}",
                    f"{fmt_ms(d['p99'])} (baseline {fmt_ms(r['baseline']['p99'])}); logins "
                    f"{r['storm']['rate']:.1f}/s, p50 {fmt_ms(r['storm']['p50'])}, all 201: "
                    f"{'yes' if logins_ok else 'NO'}",
                    f"< {TARGET_BUILDINFO_P99_S * 1000:.0f} ms, all 200/201",
                    ok,
                )
            )
            verdicts.append(
                f"TARGET 2 /buildinfo p99 < {TARGET_BUILDINFO_P99_S * 1000:.0f} ms while {args.logins} "
                f"logins run, {'through nginx' if way == 'nginx' else 'straight to gunicorn'}: "
                f"{verdict(ok)} (p99 {fmt_ms(d['p99'])})"
            )
    print_targets(rows)
    for line in verdicts:
        print(line)
    if args.quick:
        print("(quick smoke run: short segments, noisier figures)")


if __name__ == "__main__":
    main()
