"""Workspace agents at scale: N real agents held by one host. Run by hand:

    .venv/bin/python -m bench.agents                         # 500, 2,000 and 10,000 agents
    .venv/bin/python -m bench.agents --agents 500,2000       # chosen sizes
    .venv/bin/python -m bench.agents --quick                 # smoke run (100 agents, short phases)
    .venv/bin/python -m bench.agents --only capacity         # past the per-worker cap only

It starts its own PostgreSQL and Redis (devtools.pg_server, devtools.redis_server),
one small HTTP app (tests/support/workspace_app.py) and, for each N, the workspace
platform on both (devtools.services: gunicorn, 2 gevent workers, REDIS_URL and a mesh
secret, as a scaled-out host runs), with a fresh database. Through the API it makes
the first user and N agents, 8 per workspace (the most a workspace may have), each
declaring one app (`app`, the app above), the workspaces created concurrently.

Then N real agents (the project's own `workspace_agent.agent.Agent`, `run_forever()`,
each with its own token) start at once, spread over a few asyncio processes (the
"swarm": 4 at most, each its own event loop), and it measures, each phase bounded:

  connect   seconds from the agents' start until the platform's `/metrics` gauge
            bundle_workspace_agents_connected says N (and the agents' own count:
            their HELLO answered, the connection open); a run that does not get
            there within --connect-timeout (plus --ramp), or whose agents' count
            stops rising for --stall seconds (a collapse), is reported as it
            stands (with a trace every 5 s) and goes on.
  idle      over --idle seconds, all connected and nothing asked of them (the
            platform pings each every WORKSPACE_AGENT_PING_SECONDS, 5 s): the
            workers' and master's RSS before the agents and now (kB per agent), the
            workers' CPU per 1,000 agents, PostgreSQL's commits and the agents'
            table's row updates per second (pg_stat_database, pg_stat_user_tables),
            and the CPU of PostgreSQL, Redis and the swarm.
  users     an open-loop load of --rate requests/s for --users seconds, in turn: an
            agent's status (GET /api/v2/workspaceagents/<id>), the app's /hello
            through a random agent (its `path`, /@owner/<workspace>.<agent>/apps/app/),
            and GET /api/v2/users/me; latency from each request's scheduled time,
            p50/p95/p99, and failures (a non-2xx answer, a transport error or no
            answer within 10 s; 60 s in the restart's storm, where a request may be
            slow but must not fail, and those slower than 10 s are counted).
  log       lines of the platform's log with "MaxConnectionsExceeded",
            "Traceback" and "bare LF".
  restart   (a reconnect storm) `systemctl restart` as devtools.services does it, on
            the socket the bench holds as systemd's bundle@.socket does, with the N
            agents connected and users' requests going on (--storm-seconds, 0: no
            restart): seconds until the gauge says all N are back, and the users'
            figures and failures around it.

Past capacity (`--only capacity`, and in a full run): when the platform has a
per-worker cap on held agents (WORKSPACE_AGENTS_PER_WORKER in
app/workspace/settings.py), the platform runs with a small cap (--cap), agents
fill 80 % of what the workers may hold, then 70 % more start: whether those
connected stay so, the users' figures meanwhile, and how the extra agents are
refused (HTTP status or close code) and how often they retry. Skipped with a
message while the cap does not exist.

gunicorn's worker_connections is set to room for every agent on either worker
(--worker-connections to choose): the kernel does not split the agents evenly, and
the bench measures the platform, not that setting. PostgreSQL 15+ publishes a
backend's statistics up to a second late (10 s when it goes idle): the writes per
second are over the whole idle window, with the one UPDATE per pong expected beside.

Everything (platform, databases, swarm, this client) shares the machine's CPUs:
the load generator's CPU is printed beside the platform's. Asserts nothing; never
a test.
"""

if __name__ == "__main__":  # the swarm's processes import this module unpatched: they run asyncio
    from gevent import monkey

    monkey.patch_all()

# isort: split
import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HOST,
    KeepAliveClient,
    Service,
    build_request,
    exit_on_sigterm,
    fmt_ms,
    machine_busy_seconds,
    percentile,
    proc_cpu_seconds,
    proc_status_kb,
    raise_nofile,
    run_header,
    self_cpu_seconds,
)

OWNER = {"email": "owner@example.com", "username": "owner", "password": "correct horse battery"}
TOKEN_HEADER = "Workspace-Session-Token"
MESH_SECRET = "the agents bench's mesh secret"
AGENTS_PER_WORKSPACE = 8  # CreateWorkspaceSchema's most
WORKERS = 2
SWARM_PROCESSES = 4
AGENTS_PER_PROCESS_MIN = 50  # fewer agents than 4 x this: fewer processes
CREATE_CONCURRENCY = 8  # workspaces created at once
USER_TIMEOUT_S = 10.0
# In the restart's storm, "no request fails other than by being slow": a user's request
# waits for its agent's return (app.workspace.tunnel.agents' STORM_WAIT_SECONDS), up to
# what nginx waits for an answer (proxy_read_timeout, 60 s) before a browser gets a 504.
STORM_USER_TIMEOUT_S = 60.0
MAX_REDIRECTS = 20  # as browsers
SWARM_STOP_S = 15.0  # for the swarm's processes to end after SIGTERM, all together; then killed
REPORT_EVERY_S = 0.5  # a swarm process's report of its agents
GAUGE = re.compile(r"^bundle_workspace_agents_connected(?:\{[^}]*\})?\s+(\S+)", re.M)
LOG_ERRORS = ("MaxConnectionsExceeded", "Traceback", "bare LF")
CAP_VARIABLE = "WORKSPACE_AGENTS_PER_WORKER"
# The anchors (their published figures, other hardware).
COLLAPSE_SHARE = 0.5  # fewer connected than this share at the end of the connect phase: collapsed
PING_SECONDS = 5  # WORKSPACE_AGENT_PING_SECONDS's default, which the bench keeps
GOAL_P95_S = 0.220
GOAL_KB_PER_AGENT = 100
GOAL_CONNECT_S = 60
ANCHORS = (
    "Coder's scale test: 2,000 users, workspaces and agents on 2 replicas x 4 vCPU / 16 GB "
    "(database on 2 more vCPU): agent API p95 220 ms",
    "PocketBase: 10,000+ realtime connections on a 2-vCPU machine (one server)",
)


# =========================================================================== the swarm (asyncio)


def swarm_main():
    """A swarm process: its config (JSON) on stdin, a report (JSON) on stdout every
    REPORT_EVERY_S until SIGTERM."""
    config = json.loads(sys.stdin.read())
    raise_nofile()
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_swarm(config))


async def _swarm(config):
    import weakref

    import workspace_agent.agent as agent_module
    from workspace_protocol.websocket import HandshakeRefused

    outcomes, reasons = Counter(), {}
    helloed = weakref.WeakSet()  # the links whose HELLO the platform answered
    real_connect = agent_module.connect

    async def counted_connect(url, headers, opens, on_open=None, on_hello=None, on_relay=None, **kw):
        def hello(link, info):
            helloed.add(link)
            on_hello(link, info)

        try:
            return await real_connect(url, headers, opens, on_open=on_open, on_hello=hello, on_relay=on_relay, **kw)
        except HandshakeRefused as exc:
            outcomes[f"refused HTTP {exc.status_code}"] += 1
            raise
        except (TimeoutError, OSError) as exc:
            outcomes[f"dial {type(exc).__name__}"] += 1
            raise

    agent_module.connect = counted_connect  # this process only: counts what each attempt came to

    class CountedAgent(agent_module.Agent):
        async def connect_once(self):
            self.link = None
            outcomes["attempts"] += 1
            try:
                return await super().connect_once()
            finally:
                if self.link is not None:
                    code = self.link.close_code
                    key = f"{'closed after HELLO' if self.link in helloed else 'closed before HELLO'} code {code}"
                    outcomes[key] += 1
                    if self.link.closed.done():
                        reasons.setdefault(key, str(self.link.closed.result()))

        def up(self):
            link = self.link
            return link is not None and link in helloed and not link.closed.done()

    apps = {"app": config["app_url"]}
    agents = [CountedAgent(config["url"], token, apps, 300.0) for token in config["tokens"]]
    loop = asyncio.get_running_loop()
    stopping = loop.create_future()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, lambda: stopping.done() or stopping.set_result(None))
    started = time.monotonic()

    async def start(agent, delay):
        await asyncio.sleep(delay)
        await agent.run_forever()

    # --ramp: the agents' starts spread evenly over that many seconds (0: all at once, as after a restart).
    ramp = config["ramp"]
    tasks = [asyncio.ensure_future(start(agent, ramp * i / len(agents))) for i, agent in enumerate(agents)]

    def report():
        print(
            json.dumps(
                {
                    "t": round(time.monotonic() - started, 3),
                    "connected": sum(1 for agent in agents if agent.up()),
                    "ended": sum(1 for task in tasks if task.done()),  # an agent that gave up (outdated)
                    "outcomes": dict(outcomes),
                    "reasons": reasons,
                }
            ),
            flush=True,
        )

    while not stopping.done():
        report()
        await asyncio.wait([stopping], timeout=REPORT_EVERY_S)
    report()
    for agent in agents:
        agent.stop()
    await asyncio.sleep(0.5)  # the close frames go out
    # Unwinding thousands of tasks one by one can take many seconds on a loaded machine;
    # the agents have said goodbye, nothing else is left to do.
    sys.stdout.flush()
    os._exit(0)


# =========================================================================== the bench (gevent)


def count(n):
    return f"{n:,}"


def num(value, spec):
    """`value` formatted, or "-" for a figure that could not be measured."""
    return "-" if value is None else format(value, spec)


class Swarm:
    """Swarm processes holding `tokens`' agents, their reports read as they come."""

    def __init__(self, root, name, url, app_url, tokens, ramp=0.0, processes=None):
        import gevent

        processes = processes or max(1, min(SWARM_PROCESSES, len(tokens) // AGENTS_PER_PROCESS_MIN))
        self.parts = [tokens[i::processes] for i in range(processes)]
        self.processes, self.reports, self.logs, self.readers = [], {}, [], []
        self.started = time.monotonic()
        for index, part in enumerate(self.parts):
            log = open(root / f"{name}-{index}.log", "wb")
            process = subprocess.Popen(
                [sys.executable, "-c", "import bench.agents as b; b.swarm_main()"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            process.stdin.write(json.dumps({"url": url, "app_url": app_url, "tokens": part, "ramp": ramp}).encode())
            process.stdin.close()
            self.processes.append(process)
            self.logs.append(log)
            self.readers.append(gevent.spawn(self._read, index, process))

    def _read(self, index, process):
        for line in process.stdout:
            try:
                self.reports[index] = json.loads(line)
            except ValueError:
                pass

    @property
    def pids(self):
        return [p.pid for p in self.processes]

    def connected(self):
        return sum(r["connected"] for r in self.reports.values())

    def ended(self):
        """Agents whose run_forever() returned or raised (an outdated agent gives up)."""
        return sum(r.get("ended", 0) for r in self.reports.values())

    def outcomes(self):
        total, reasons = Counter(), {}
        for report in self.reports.values():
            total.update(report["outcomes"])
            reasons.update(report.get("reasons", {}))
        return total, reasons

    def alive(self):
        return all(p.poll() is None for p in self.processes)

    def stop(self):
        import gevent

        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + SWARM_STOP_S
        self.killed = 0
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                self.killed += 1
        gevent.joinall(self.readers, timeout=5)
        for log in self.logs:
            log.close()


class Cpu:
    """CPU seconds of groups of processes (and this one) between start() and stop()."""

    def __init__(self, groups):
        self.groups = groups  # name -> callable giving pids

    def _read(self):
        values = {name: sum(proc_cpu_seconds(pid) or 0.0 for pid in pids()) for name, pids in self.groups.items()}
        values["client"] = self_cpu_seconds()
        values["machine"] = machine_busy_seconds()[0]
        return values

    def start(self):
        self.t0, self.v0 = time.monotonic(), self._read()
        return self

    def stop(self):
        self.seconds = time.monotonic() - self.t0
        v1 = self._read()
        self.used = {name: max(0.0, v1[name] - self.v0[name]) for name in v1}
        known = sum(v for k, v in self.used.items() if k != "machine")
        self.used["other"] = max(0.0, self.used["machine"] - known)
        return self

    def share(self, name):
        """CPU seconds per second of `name` (1.0 = one core)."""
        return self.used[name] / self.seconds if self.seconds else 0.0


def children(pid):
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def postgres_pids(postgres):
    try:
        master = int(Path(postgres.data, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    return [master, *children(master)]


def rss_mb(service):
    """(sum of the workers' RSS, the master's), MB."""
    workers = sum(proc_status_kb(pid, "VmRSS") or 0 for pid in service.running.worker_pids()) / 1024
    return workers, (proc_status_kb(service.running.process.pid, "VmRSS") or 0) / 1024


def per_worker(platform):
    """The connections to the platform each worker holds (the agents', at idle), in pid order."""
    from devtools.worker_sockets import connection_workers

    pids = sorted(platform.worker_pids())
    held = Counter(connection_workers(platform.port, pids).values())
    return [held.get(pid, 0) for pid in pids]


def pg_counters(url):
    """(commits of the database, row updates of the agents' table, of all tables)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        commits = conn.execute("select xact_commit from pg_stat_database where datname = current_database()").fetchone()
        tables = conn.execute("select relname, n_tup_upd from pg_stat_user_tables").fetchall()
    agent_updates = sum(n for name, n in tables if "agent" in name and "app" not in name)
    return commits[0], agent_updates, sum(n for _, n in tables)


def gauge(port):
    """The platform's connected-agents gauge (None when /metrics does not answer)."""
    client = KeepAliveClient(port, timeout=5)
    try:
        status, _, body = client.request("GET", "/metrics")
    except (OSError, ConnectionError, ValueError):
        return None
    finally:
        client.close()
    if status != 200:
        return None
    return sum(float(v) for v in GAUGE.findall(body.decode("latin-1")))


# --------------------------------------------------------------------------- the platform and its agents


class Platform:
    """The workspace platform on 2 workers, PostgreSQL and Redis, with its first user."""

    def __init__(self, root, postgres, redis_server, worker_connections, extra_env=None):
        self.database_url = postgres.new_database("agents")
        data_dir = root / "platform-data"
        data_dir.mkdir()
        self.log_path = root / "platform.log"
        self.worker_connections = worker_connections
        env = {
            "DATABASE_URL": self.database_url,
            "REDIS_URL": redis_server.new_url(),
            "WORKSPACE_MESH_SECRET": MESH_SECRET,
            "WORKER_CONNECTIONS": str(self.worker_connections),
            "WORKSPACE_AGENT_PING_SECONDS": str(PING_SECONDS),
            **(extra_env or {}),
        }
        self.service = Service("workspace", data_dir, self.log_path, workers=WORKERS, env=env)
        self.port = self.service.port
        self.url = f"http://{HOST}:{self.port}"
        client = KeepAliveClient(self.port)
        try:
            self.token = client.json("POST", "/api/v2/users/first", OWNER, expect=(201,))["session_token"]
        finally:
            client.close()
        self.headers = {TOKEN_HEADER: self.token}

    def master_pid(self):
        return self.service.running.process.pid

    def worker_pids(self):
        return self.service.running.worker_pids()

    def log_errors(self):
        text = Path(self.log_path).read_text(errors="replace")
        return {needle: text.count(needle) for needle in LOG_ERRORS}

    def stop(self):
        self.service.stop()


def worker_connections(args, agents):
    """gunicorn's worker_connections for `agents`: --worker-connections, else room for
    every agent on either worker (the kernel does not split them evenly) and the users:
    the bench measures the platform, not this setting."""
    return args.worker_connections or max(4096, agents + 1024)


def create_agents(platform, n, app_url):
    """N agents, 8 per workspace, created CREATE_CONCURRENCY workspaces at once:
    [{id, token, path}], and the seconds it took."""
    import gevent
    from gevent.pool import Pool

    made, errors = [], Counter()
    workspaces = math.ceil(n / AGENTS_PER_WORKSPACE)
    clients = [KeepAliveClient(platform.port) for _ in range(CREATE_CONCURRENCY)]
    free = list(clients)

    def one(index):
        size = min(AGENTS_PER_WORKSPACE, n - index * AGENTS_PER_WORKSPACE)
        body = {
            "name": f"ws{index:05d}",
            "agents": [{"name": f"a{k}", "apps": [{"slug": "app", "url": app_url}]} for k in range(size)],
        }
        client = free.pop()
        try:
            for attempt in range(3):
                try:
                    answer = client.json("POST", "/api/v2/users/me/workspaces", body, platform.headers, expect=(201,))
                    break
                except Exception as exc:
                    errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
                    if attempt == 2:
                        raise
                    gevent.sleep(0.5)
            for agent in answer["agents"]:
                made.append({"id": agent["id"], "token": agent["token"], "path": agent["apps"][0]["path"]})
        finally:
            free.append(client)

    started = time.monotonic()
    pool = Pool(CREATE_CONCURRENCY)
    try:
        for index in range(workspaces):
            pool.spawn(one, index)
        pool.join(raise_error=True)
    finally:
        for client in clients:
            client.close()
    return made, time.monotonic() - started, errors


# --------------------------------------------------------------------------- users' requests


def answer_message(content):
    """The start of an error answer's message (Coder's JSON `message`, the other
    services' `error`, else the text), to tell failures of one status apart."""
    try:
        body = json.loads(content)
        message = body.get("detail") or body.get("message") or body.get("error") or ""
    except (ValueError, AttributeError):
        message = content.decode("utf-8", "replace")
    return str(message)[:70]


class UserLoad:
    """Open-loop requests at `rate`/s for `seconds`, in turn: an agent's status, the app
    through a random agent, /users/me. Latency from each request's scheduled time."""

    KINDS = ("agent status", "app GET", "users/me")

    def __init__(self, platform, agents, rate, seconds, timeout=USER_TIMEOUT_S):
        self.platform, self.agents, self.rate, self.seconds = platform, agents, rate, seconds
        self.timeout = timeout
        self.redirects = 0  # 307s followed (a stopping worker sends a GET to the next workers)
        self.latencies = {kind: [] for kind in self.KINDS}
        self.failures = {kind: Counter() for kind in self.KINDS}
        self.idle = []
        self.sent = 0

    def _host(self):
        return f"{HOST}:{self.platform.port}"

    def _request(self, kind):
        headers = self.platform.headers
        host = self._host()
        agent = random.choice(self.agents)
        if kind == "agent status":
            return build_request("GET", f"/api/v2/workspaceagents/{agent['id']}", host, headers)
        if kind == "app GET":
            return build_request("GET", agent["path"] + "hello", host, headers)
        return build_request("GET", "/api/v2/users/me", host, headers)

    def _one(self, kind, scheduled):
        client = (
            self.idle.pop()
            if self.idle
            else KeepAliveClient(self.platform.port, timeout=self.timeout, resend_stale=True)
        )
        try:
            status, headers, content = client.send(self._request(kind))
            for _ in range(MAX_REDIRECTS):  # as a browser: a 307 is followed, on the same or a new connection
                if status != 307:
                    break
                self.redirects += 1
                again = build_request("GET", headers["location"], self._host(), self.platform.headers)
                status, headers, content = client.send(again)
        except Exception as exc:
            client.close()
            self.failures[kind][type(exc).__name__] += 1
            return
        elapsed = time.monotonic() - scheduled
        if not 200 <= status < 300:
            self.failures[kind][f"HTTP {status} ({answer_message(content)})"] += 1
        elif elapsed > self.timeout:
            self.failures[kind]["late"] += 1
        else:
            self.latencies[kind].append(elapsed)
        self.idle.append(client)

    def run(self):
        import gevent

        greenlets = []
        started = time.monotonic()
        total = int(self.rate * self.seconds)
        for i in range(total):
            scheduled = started + i / self.rate
            wait = scheduled - time.monotonic()
            if wait > 0:
                gevent.sleep(wait)
            kind = self.KINDS[i % len(self.KINDS)]
            greenlets.append((kind, gevent.spawn(self._one, kind, scheduled)))
            self.sent += 1
        gevent.joinall([greenlet for _, greenlet in greenlets], timeout=self.timeout + 5)
        for kind, greenlet in greenlets:
            if not greenlet.dead:  # a connect or a send that did not end: no answer, a failure
                greenlet.kill(block=False)
                self.failures[kind]["unfinished"] += 1
        for client in self.idle:
            client.close()
        return self

    def figures(self):
        rows = {}
        everything = [x for values in self.latencies.values() for x in values]
        for kind, values in [*self.latencies.items(), ("all", everything)]:
            failures = (
                sum(sum(c.values()) for c in self.failures.values())
                if kind == "all"
                else sum(self.failures[kind].values())
            )
            rows[kind] = {
                "answered": len(values),
                "failures": failures,
                "p50": percentile(values, 50),
                "p95": percentile(values, 95),
                "p99": percentile(values, 99),
            }
        return rows

    def failure_kinds(self):
        total = Counter()
        for kind, failures in self.failures.items():
            for what, n in failures.items():
                total[f"{kind}: {what}"] += n
        return total


# --------------------------------------------------------------------------- one size


def cpu_groups(platform, postgres, redis_server, swarm_pids):
    """The processes whose CPU the bench reads, by name (each a callable giving pids)."""
    return {
        "workers": platform.worker_pids,
        "master": lambda: [platform.master_pid()],
        "postgres": lambda: postgres_pids(postgres),
        "redis": lambda: [redis_server.process.pid],
        "swarm": swarm_pids,
    }


def wait_connected(platform, swarm, n, timeout, stall):
    """Poll the gauge and the swarm's count until both say n, or `timeout`, or the
    agents' count has not passed its highest for `stall` seconds (a collapse): (seconds
    until the gauge said n or None, seconds until the agents said n or None, last gauge,
    last agents' count, a trace of (t, gauge, agents))."""
    import gevent

    gauge_at = agents_at = None
    last_gauge, trace, next_trace = None, [], 0.0
    deadline = swarm.started + timeout
    highest, highest_at = 0, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - highest_at < stall:
        if swarm.connected() > highest:
            highest, highest_at = swarm.connected(), time.monotonic()
        last_gauge = gauge(platform.port)
        t = time.monotonic() - swarm.started
        if gauge_at is None and last_gauge is not None and last_gauge >= n:
            gauge_at = t
        if agents_at is None and swarm.connected() >= n:
            agents_at = t
        if t >= next_trace:
            trace.append((t, last_gauge, swarm.connected()))
            next_trace += 5.0
        if gauge_at is not None and agents_at is not None:
            break
        if not swarm.alive():
            break
        gevent.sleep(0.25)  # polling with a deadline
    return gauge_at, agents_at, last_gauge, swarm.connected(), trace


def run_size(args, root, n, postgres, redis_server, app_url):
    """Every phase for N agents; a dict of figures."""
    import gevent

    print(
        f"\n== {count(n)} agents (WORKER_CONNECTIONS={worker_connections(args, n)}"
        + (f", starts spread over {args.ramp:g} s" if args.ramp else ", all started at once")
        + ") ==",
        flush=True,
    )
    folder = root / f"n{n}"
    folder.mkdir()
    platform = Platform(folder, postgres, redis_server, worker_connections(args, n))
    swarm = None
    result = {"n": n, "collapsed": False}
    try:
        result["rss_fresh"] = rss_mb(platform.service)
        agents, took, errors = create_agents(platform, n, app_url)
        result["create_s"] = took
        print(
            f"   created {count(len(agents))} agents in {math.ceil(n / AGENTS_PER_WORKSPACE):,} workspaces "
            f"({AGENTS_PER_WORKSPACE} per workspace, {CREATE_CONCURRENCY} at once) in {took:.1f} s"
            + (f"; errors retried: {dict(errors)}" if errors else ""),
            flush=True,
        )
        gevent.sleep(1.0)  # the creation's garbage settles before the baseline
        result["rss_before"] = rss_mb(platform.service)
        groups = cpu_groups(platform, postgres, redis_server, lambda: swarm.pids if swarm else [])
        # connect
        cpu = Cpu(groups).start()
        swarm = Swarm(folder, "swarm", platform.url, app_url, [a["token"] for a in agents], args.ramp)
        gauge_at, agents_at, last_gauge, last_agents, trace = wait_connected(
            platform, swarm, n, args.connect_timeout + args.ramp, args.stall
        )
        cpu.stop()
        result.update(
            connect_gauge_s=gauge_at,
            connect_agents_s=agents_at,
            connected_gauge=last_gauge,
            connected_agents=last_agents,
            connect_cpu=cpu,
            processes=len(swarm.processes),
        )
        print(
            f"   connect ({len(swarm.processes)} swarm processes): "
            + (
                f"gauge = {count(n)} after {gauge_at:.1f} s"
                if gauge_at is not None
                else f"gauge {last_gauge} at the end"
            )
            + ", "
            + (
                f"agents' own count = {count(n)} after {agents_at:.1f} s"
                if agents_at is not None
                else f"agents' own count {count(last_agents)} at the end ({trace[-1][0]:.0f} s: deadline or stalled)"
            )
            + f"; CPU: workers {cpu.share('workers'):.2f}, swarm {cpu.share('swarm'):.2f}, "
            f"postgres {cpu.share('postgres'):.2f} cores",
            flush=True,
        )
        if gauge_at is None or agents_at is None:
            print("   trace (s, gauge, agents' count): " + ", ".join(f"({t:.0f}, {g}, {a})" for t, g, a in trace))
        if (last_agents or 0) < COLLAPSE_SHARE * n:
            result["collapsed"] = True
        # idle
        gevent.sleep(args.settle)  # the connect burst's writes and garbage end
        c0, u0, t0 = pg_counters(platform.database_url)
        w0 = time.monotonic()
        cpu = Cpu(groups).start()
        gevent.sleep(args.idle)
        cpu.stop()
        result["rss_idle"] = rss_mb(platform.service)
        c1, u1, t1 = pg_counters(platform.database_url)
        window = time.monotonic() - w0
        held = swarm.connected()
        per_agent = held >= COLLAPSE_SHARE * n  # else the figures per agent mean nothing
        result.update(
            idle_cpu=cpu,
            per_worker=per_worker(platform),
            idle_agents=swarm.connected(),
            idle_gauge=gauge(platform.port),
            commits_per_s=(c1 - c0) / window,
            agent_updates_per_s=(u1 - u0) / window,
            updates_per_s=(t1 - t0) / window,
            kb_per_agent=(result["rss_idle"][0] - result["rss_before"][0]) * 1024 / held if per_agent else None,
            cpu_per_1000=cpu.share("workers") / (held / 1000) if per_agent else None,
        )
        print(
            f"   idle {args.idle:g} s with {count(result['idle_agents'])} agents (gauge {result['idle_gauge']}): "
            f"workers' RSS {result['rss_before'][0]:.0f} -> {result['rss_idle'][0]:.0f} MB "
            f"({num(result['kb_per_agent'], '.0f')} kB per agent), "
            f"master {result['rss_before'][1]:.0f} -> {result['rss_idle'][1]:.0f} MB; "
            f"workers' CPU {cpu.share('workers'):.3f} cores ({num(result['cpu_per_1000'], '.3f')} per 1,000 agents); "
            f"PostgreSQL {result['commits_per_s']:.0f} commits/s, {result['agent_updates_per_s']:.0f} agent rows "
            f"updated/s (one per pong: {held / PING_SECONDS:.0f}/s), CPU {cpu.share('postgres'):.2f}; "
            f"Redis CPU {cpu.share('redis'):.3f}; "
            f"swarm CPU {cpu.share('swarm'):.2f}; other {cpu.share('other'):.2f}; "
            f"connections per worker {result['per_worker']}",
            flush=True,
        )
        # users
        cpu = Cpu(groups).start()
        load = UserLoad(platform, agents, args.rate, args.users).run()
        cpu.stop()
        result.update(users=load.figures(), user_failures=load.failure_kinds(), users_cpu=cpu)
        print_users(load.figures(), load.failure_kinds(), cpu, args)
        outcomes, reasons = swarm.outcomes()
        result["outcomes"] = outcomes
        result["log"] = platform.log_errors()
        print(
            f"   agents' connection attempts: {dict(outcomes)}"
            + (f"; {swarm.ended()} agents gave up" if swarm.ended() else "")
        )
        print(f"   platform log: {result['log']}", flush=True)
        if args.storm and not result["collapsed"]:
            result["storm"] = restart_storm(args, platform, agents, n, groups)
    finally:
        stopped = time.monotonic()
        if swarm is not None:
            swarm.stop()
        result["swarm_stop_s"] = time.monotonic() - stopped
        platform.stop()
        result["platform_stop_s"] = platform.service.stop_seconds
        print(
            f"   stopped: the swarm in {result['swarm_stop_s']:.1f} s"
            + (f" ({swarm.killed} process(es) killed)" if swarm is not None and swarm.killed else "")
            + ", the platform in "
            f"{result['platform_stop_s'] or 0:.1f} s",
            flush=True,
        )
        keep_log(args, platform, f"platform-{n}.log")
    return result


def restart_storm(args, platform, agents, n, groups):
    """`systemctl restart` with N agents connected, on the socket the bench holds as
    systemd's bundle@.socket does: seconds until the gauge says all N are back, and the
    users' requests meanwhile (a failure is any answer but 2xx, or none in time)."""
    import gevent

    load = UserLoad(platform, agents, args.rate, args.storm_seconds, timeout=STORM_USER_TIMEOUT_S)
    users = gevent.spawn(load.run)
    gevent.sleep(2.0)  # the users' requests run before the restart too
    started = time.monotonic()
    stop_took = platform.service.running.restart()
    ready = time.monotonic() - started
    cpu = Cpu(groups).start()  # from the new workers' start: the old ones' pids are gone
    back, last = None, None
    while time.monotonic() - started < args.connect_timeout:
        last = gauge(platform.port)
        if last is not None and last >= n:
            back = time.monotonic() - started
            break
        gevent.sleep(0.25)  # polling with a deadline
    cpu.stop()
    users.join()
    figures, failures = load.figures(), load.failure_kinds()
    print(
        f"   restart on the held socket: stopped in {stop_took:.1f} s, ready {ready:.1f} s after it began; "
        + (
            f"all {count(n)} agents back {back:.1f} s after it began"
            if back is not None
            else f"gauge {last} at the end"
        )
        + f"; CPU until then: workers {cpu.share('workers'):.2f}, swarm {cpu.share('swarm'):.2f} cores",
        flush=True,
    )
    print_users(figures, failures, cpu, args, args.storm_seconds)
    slow = sum(1 for values in load.latencies.values() for seconds in values if seconds > USER_TIMEOUT_S)
    print(
        f"     answered, but after more than {USER_TIMEOUT_S:g} s: {slow}; redirects followed: {load.redirects}",
        flush=True,
    )
    return {"slow": slow, "back_s": back, "stop_s": stop_took, "ready_s": ready, "users": figures, "failures": failures}


def keep_log(args, platform, name):
    if args.keep_logs:
        Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
        shutil.copy(platform.log_path, Path(args.keep_logs) / name)


def print_users(rows, failures, cpu, args, seconds=None):
    print(f"   users: {args.rate:g} requests/s open loop for {seconds or args.users:g} s")
    for kind, row in rows.items():
        print(
            f"     {kind:<13} answered {row['answered']:>5}, failed {row['failures']:>4}: "
            f"p50 {fmt_ms(row['p50'])}, p95 {fmt_ms(row['p95'])}, p99 {fmt_ms(row['p99'])}"
        )
    if failures:
        print(f"     failures: {dict(failures)}")
    print(
        f"     CPU meanwhile: workers {cpu.share('workers'):.2f}, swarm {cpu.share('swarm'):.2f}, "
        f"client {cpu.share('client'):.2f}, postgres {cpu.share('postgres'):.2f}, other {cpu.share('other'):.2f} cores",
        flush=True,
    )


# --------------------------------------------------------------------------- past capacity


def cap_exists():
    settings = ROOT / "app" / "workspace" / "settings.py"
    return CAP_VARIABLE in settings.read_text()


def run_capacity(args, root, postgres, redis_server, app_url):
    """Agents to 80 % of the cap, then 70 % more (150 % of what the workers may hold):
    a dict of figures, or None when the platform has no cap."""
    import gevent

    if not cap_exists():
        print(
            f"\n== Past capacity: skipped, the platform has no per-worker cap yet ({CAP_VARIABLE} is not in "
            "app/workspace/settings.py) =="
        )
        return None
    capacity = args.cap * WORKERS
    held, extra = int(0.8 * capacity), int(0.7 * capacity)
    print(
        f"\n== Past capacity: {CAP_VARIABLE}={args.cap} x {WORKERS} workers = {count(capacity)}; "
        f"{count(held)} agents, then {count(extra)} more ==",
        flush=True,
    )
    folder = root / "capacity"
    folder.mkdir()
    platform = Platform(
        folder, postgres, redis_server, worker_connections(args, held + extra), {CAP_VARIABLE: str(args.cap)}
    )
    first = second = None
    result = {"cap": args.cap, "held": held, "extra": extra}
    try:
        agents, _, _ = create_agents(platform, held + extra, app_url)
        first = Swarm(folder, "first", platform.url, app_url, [a["token"] for a in agents[:held]])
        _, _, last_gauge, last_agents, _ = wait_connected(platform, first, held, args.connect_timeout, args.stall)
        print(f"   the first {count(held)}: gauge {last_gauge}, agents' own count {count(last_agents)}", flush=True)
        result["first_connected"] = last_agents
        first_before, _ = first.outcomes()
        cpu = Cpu(
            cpu_groups(platform, postgres, redis_server, lambda: [*first.pids, *(second.pids if second else [])])
        ).start()
        second = Swarm(folder, "second", platform.url, app_url, [a["token"] for a in agents[held:]])
        load = UserLoad(platform, agents[:held], args.rate, args.users).run()  # on the agents connected
        gevent.sleep(1.0)  # the last reports of the swarms
        cpu.stop()
        first_after, _ = first.outcomes()
        outcomes, reasons = second.outcomes()
        result.update(
            first_still=first.connected(),
            first_reconnects=first_after["attempts"] - first_before["attempts"],
            second_connected=second.connected(),
            second_outcomes=outcomes,
            reasons=reasons,
            users=load.figures(),
            log=platform.log_errors(),
            gauge=gauge(platform.port),
            per_worker=per_worker(platform),
        )
        refused = extra - result["second_connected"]
        retries = (
            f"about {(outcomes['attempts'] - extra) / refused / (cpu.seconds / 60):.1f} retries per refused agent "
            "per minute"
            if refused > 0
            else "none refused: the cap did not bite"
        )
        print(
            f"   after {cpu.seconds:.0f} s: the first {count(held)}: {count(result['first_still'])} still connected "
            f"({result['first_reconnects']} reconnects among them); the extra {count(extra)}: "
            f"{count(result['second_connected'])} connected; gauge {result['gauge']}; "
            f"connections per worker {result['per_worker']}"
        )
        print(f"   the extra agents' attempts: {dict(outcomes)} ({retries})")
        for key, reason in reasons.items():
            print(f"     {key}: {reason[:160]!r}")
        print_users(load.figures(), load.failure_kinds(), cpu, args)
        print(f"   platform log: {result['log']}", flush=True)
    finally:
        for swarm in (second, first):
            if swarm is not None:
                swarm.stop()
        platform.stop()
        keep_log(args, platform, "platform-capacity.log")
    return result


# --------------------------------------------------------------------------- the report


def met(ok):
    return "met" if ok else "NOT MET"


def print_sizes(results):
    head = (
        f"   {'agents':>7} {'create':>7} {'connect':>8} {'RSS before':>10} {'RSS idle':>9} {'kB/agent':>8} "
        f"{'CPU/1k':>7} {'commits/s':>9} {'upd/s':>6} {'users p50':>9} {'p95':>8} {'p99':>8} {'fail':>5} "
        f"{'swarm CPU':>9} {'client':>6}  log"
    )
    print(head)
    for r in results:
        users = r.get("users", {}).get("all", {})
        connect = r.get("connect_gauge_s")
        idle_cpu = r.get("idle_cpu")
        users_cpu = r.get("users_cpu")
        print(
            f"   {count(r['n']):>7} {r.get('create_s', 0):>6.1f}s "
            f"{(f'{connect:.1f}s' if connect is not None else 'never'):>8} "
            f"{r.get('rss_before', (0, 0))[0]:>8.0f}MB {r.get('rss_idle', (0, 0))[0]:>7.0f}MB "
            f"{num(r.get('kb_per_agent'), '.0f'):>8} {num(r.get('cpu_per_1000'), '.3f'):>7} "
            f"{r.get('commits_per_s', 0):>9.0f} {r.get('agent_updates_per_s', 0):>6.0f} "
            f"{fmt_ms(users.get('p50')):>9} {fmt_ms(users.get('p95')):>8} {fmt_ms(users.get('p99')):>8} "
            f"{users.get('failures', 0):>5} "
            f"{(idle_cpu.share('swarm') if idle_cpu else 0):>8.2f}c "
            f"{(users_cpu.share('client') if users_cpu else 0):>5.2f}c  {r.get('log', {})}"
            + ("  COLLAPSED" if r.get("collapsed") else "")
        )
    print(
        "   (connect: seconds from the agents' start until the gauge said all; RSS: the 2 workers' sum; "
        "CPU/1k: the workers' cores per 1,000 idle agents; commits/s and upd/s: PostgreSQL's commits and the "
        "agents' rows updated per second while idle; swarm CPU while idle, client CPU during the users' load, in cores)"
    )
    print("   goals: users' p95 <= 220 ms, <= 100 kB per idle agent, all connected within 60 s")
    for r in results:
        p95 = r.get("users", {}).get("all", {}).get("p95")
        kb = r.get("kb_per_agent")
        connect = r.get("connect_gauge_s")
        print(
            f"   {count(r['n']):>7} agents: p95 {fmt_ms(p95)} ({met(p95 is not None and p95 <= GOAL_P95_S)}), "
            f"{num(kb, '.0f')} kB/agent ({met(kb is not None and kb <= GOAL_KB_PER_AGENT)}), "
            f"connect {'never' if connect is None else f'{connect:.1f} s'} "
            f"({met(connect is not None and connect <= GOAL_CONNECT_S)})"
        )


def print_capacity(capacity):
    users = capacity["users"]["all"]
    print(
        f"   past capacity (cap {capacity['cap']} per worker): of the first {count(capacity['held'])}, "
        f"{count(capacity['first_still'])} still connected; extra connected {count(capacity['second_connected'])} of "
        f"{count(capacity['extra'])}; users p95 {fmt_ms(users['p95'])}, failures {users['failures']}; "
        f"the extra agents' attempts {dict(capacity['second_outcomes'])}"
    )


def print_summary(results, capacity):
    print("\n== Summary ==")
    print(f"   machine: {os.cpu_count()} CPUs shared with the load generator (and other sessions' work: see 'other')")
    if results:
        print_sizes(results)
    if capacity:
        print_capacity(capacity)
    print("   anchors:")
    for anchor in ANCHORS:
        print(f"     - {anchor}")
    figures = {}
    for r in results:
        users = r.get("users", {}).get("all", {})
        figures[str(r["n"])] = {
            "connect_s": r.get("connect_gauge_s"),
            "kb_per_agent": None if r.get("kb_per_agent") is None else round(r["kb_per_agent"]),
            "cpu_per_1000": None if r.get("cpu_per_1000") is None else round(r["cpu_per_1000"], 4),
            "commits_per_s": round(r.get("commits_per_s", 0), 1),
            "p95_ms": None if users.get("p95") is None else round(users["p95"] * 1000, 1),
            "failures": users.get("failures"),
            "collapsed": r.get("collapsed"),
        }
    print(json.dumps(figures))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", default="500,2000,10000", help="the sizes, comma-separated (default 500,2000,10000)")
    p.add_argument("--connect-timeout", type=float, default=120.0, help="seconds for all to connect (default 120)")
    p.add_argument(
        "--stall",
        type=float,
        default=60.0,
        help="end the connect phase when the agents' count has not risen for this many seconds (default 60)",
    )
    p.add_argument("--settle", type=float, default=5.0, help="seconds after connecting before the idle window")
    p.add_argument("--idle", type=float, default=20.0, help="the idle window, seconds (default 20)")
    p.add_argument("--rate", type=float, default=50.0, help="users' requests per second (default 50)")
    p.add_argument("--users", type=float, default=30.0, help="seconds of users' requests (default 30)")
    p.add_argument("--cap", type=int, default=250, help=f"{CAP_VARIABLE} in the capacity phase (default 250)")
    p.add_argument(
        "--ramp", type=float, default=0.0, help="spread the agents' starts over this many seconds (default 0: at once)"
    )
    p.add_argument(
        "--worker-connections",
        type=int,
        help="gunicorn's worker_connections (default: the agents + 1,024, room for all on either worker)",
    )
    p.add_argument(
        "--storm-seconds",
        type=float,
        default=60.0,
        help="users' requests around the restart that ends each size (default 60; 0: no restart)",
    )
    p.add_argument("--only", choices=("sizes", "capacity"))
    p.add_argument("--keep-logs", metavar="DIR", help="copy the platform's log of each run into DIR")
    p.add_argument("--quick", action="store_true", help="smoke run: 100 agents, short phases")
    args = p.parse_args(argv)
    if args.quick:
        args.agents, args.connect_timeout, args.stall = "100", 60.0, 20.0
        args.settle, args.idle, args.users, args.cap, args.storm_seconds = 1.0, 3.0, 3.0, 50, 10.0
    args.storm = args.storm_seconds > 0
    args.sizes = [int(x) for x in args.agents.split(",") if x.strip()]
    return args


def traversable(path):
    """Whether every folder down to `path` lets other users through (o+x)."""
    path = Path(path).resolve()
    return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in [*reversed(path.parents), path])


def start_postgres(server_class):
    """PostgreSQL runs as a user of its own when the bench runs as root: its folder goes
    in the temporary folder only when that user can reach it (tests/bench gives the bench
    a private TMPDIR), else in /tmp."""
    if traversable(tempfile.gettempdir()):
        return server_class()
    saved, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        return server_class()
    finally:
        tempfile.tempdir = saved


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    raise_nofile()
    print(run_header("workspace agents benchmark", args.quick), flush=True)
    from devtools.pg_server import PostgresServer
    from devtools.redis_server import RedisServer
    from devtools.services import free_port, terminate, wait_healthy

    root = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    results, capacity = [], None
    app = None
    try:
        with RedisServer() as redis_server, start_postgres(PostgresServer) as postgres:
            app_port = free_port()
            app_log = open(root / "app.log", "wb")
            app = subprocess.Popen(
                [sys.executable, "-m", "tests.support.workspace_app", str(app_port)],
                cwd=ROOT,
                stdout=app_log,
                stderr=subprocess.STDOUT,
            )
            app_url = f"http://{HOST}:{app_port}"
            wait_healthy(app_url + "/hello")
            if args.only != "capacity":
                for n in args.sizes:
                    results.append(run_size(args, root, n, postgres, redis_server, app_url))
            if args.only != "sizes":
                capacity = run_capacity(args, root, postgres, redis_server, app_url)
    finally:
        if app is not None:
            try:
                terminate(app, 10)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(root, ignore_errors=True)
    print_summary(results, capacity)


if __name__ == "__main__":
    main()
