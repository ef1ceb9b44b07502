"""Fan-out beside its floor: one event to N open SSE streams on ONE worker, for the
deck stream and the wizard's /api/events, beside two references measured in the same
run. Run by hand:

    .venv/bin/python -m bench.fanout            # full run (5,000 streams, 10 writes)
    .venv/bin/python -m bench.fanout --quick    # smoke run (200 streams, 3 writes)
    .venv/bin/python -m bench.fanout --streams 2000 --only floor,wizard

The targets, each started in turn in a process of its own on 127.0.0.1, no nginx:

- floor: a minimal Flask broadcaster on gunicorn's gevent worker (bench/fanout_apps.py:
  a queue per stream, each event serialized once): what one of our streams costs
  beyond it is our own code;
- starlette: the same broadcaster in Starlette on uvicorn, what a FastAPI user would pick;
- decks: a review session's stream (`GET /api/sessions/<id>/stream`), written by
  `POST /api/sessions/<id>/events` (a note);
- wizard: `GET /api/events`, written by `POST /api/collections/saved_prompts`.

For each: N streams are opened (each waits for its `: stream open`), the worker's
RSS is read before and after (kB per stream), then W writes, one at a time: each is
timed from just before its POST is sent to the moment each stream has read the
record it caused (the client counts `data:` lines). Figures: p50/p99/max over all
writes, the worst write's p99, the worker's CPU per write. The verdicts are the
issue's: p99 <= 1.3 x the floor's and below Starlette's, <= 25 kB per stream.

The clients run in this process on gevent (a greenlet and a raw socket per stream),
on the same 2 CPUs as the target: compare the ratios, not the times.

One host at full scale (`--nginx`, issue #38's goal 2): every target on `--workers`
(2) gunicorn workers behind a real nginx (the production site templates, with the
playbook's limits: nginx's worker_connections and worker_rlimit_nofile from
ops/roles/nginx/defaults, gunicorn's default WORKER_CONNECTIONS):

    .venv/bin/python -m bench.fanout --nginx --rounds 3        # 10,000 streams, 2 workers
    .venv/bin/python -m bench.fanout --nginx --quick           # 200 streams, no keepalive hold

- floor: the floor spread over the workers (`floor_redis` of bench/fanout_apps.py: a
  publish is one Redis PUBLISH, each worker's one subscriber feeds its queues), behind
  nginx's wizard site (its SSE location, as the wizard's streams are);
- decks: a session's stream, its workers on one data folder (inotify across workers);
- wizard: `/api/events`, its workers on Redis (devtools.redis_server).

Streams and writes both go through nginx (the streams as `public`, as nginx says),
the streams from 100 each of the loopback addresses 127.1.x.y, as viewers come from
many addresses (the deck site's limits are per address: 200 open streams, bursts of
120 requests). Figures beside the one-worker ones: the services'
and nginx's kB per stream (their workers' RSS before and after the streams open), how
the streams spread over the workers, the client's own CPU, and the keepalives: the
streams are held `--hold` (60) seconds after the last one opened, and each one's
keepalive comments are timed (goal: every interval 25 s, within 10%). `--rounds R`
measures every target R times, the order reversed every other round (only the first
round holds), and pools each target's latencies: the machine's other load then weighs
on every target alike. Verdicts: p99 <= 1.3 x the floor's, <= 25 kB per stream,
keepalives on schedule; beside them each service's CPU per write, which other load
does not change.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import yaml  # noqa: E402
from gevent.event import Event  # noqa: E402
from gevent.lock import BoundedSemaphore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/fanout.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HOST,
    CpuMeter,
    KeepAliveClient,
    Service,
    child_pids,
    exit_on_sigterm,
    fmt_ms,
    percentile,
    print_targets,
    proc_status_kb,
    raise_nofile,
    run_header,
    stop_nginx,
)
from devtools import nginx as devnginx  # noqa: E402
from devtools.redis_server import RedisServer  # noqa: E402
from devtools.services import accepts, free_port, terminate  # noqa: E402
from devtools.waiting import wait_for  # noqa: E402
from tests.support.decks import copy_sample_deck  # noqa: E402

TARGETS = ("floor", "starlette", "decks", "wizard")
HOST_TARGETS = ("floor", "decks", "wizard")  # --nginx: no Starlette (one process, no workers)
KEEPALIVE_S = 25.0  # app/common/sse.py's KEEPALIVE_SECONDS
KEEPALIVE_TOLERANCE = 0.1  # an interval within 10% of it is on schedule
KEEPALIVE = b": keepalive"  # its comment (11 bytes)
# --nginx: streams per client address, within the deck site's limits per address (200
# open streams, bursts of 120 requests).
STREAMS_PER_ADDRESS = 100
OPEN_TIMEOUT_S = 60.0  # every stream connected and told ': stream open'
DELIVERY_TIMEOUT_S = 30.0  # one write reaching every stream
START_TIMEOUT_S = 30.0
VENV_BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------- targets


def production_worker_connections():
    """gunicorn.conf.py's default WORKER_CONNECTIONS (what a service runs with unless
    its environment file says otherwise)."""
    text = (ROOT / "gunicorn.conf.py").read_text()
    return int(re.search(r'WORKER_CONNECTIONS", "(\d+)"', text).group(1))


def production_nginx_limits():
    """nginx's limits as the playbook sets them (ops/roles/nginx/defaults/main.yml); the
    open-file limit no higher than this process's hard one, which nginx's workers cannot
    pass without CAP_SYS_RESOURCE (a container's root may lack it)."""
    defaults = yaml.safe_load((ROOT / "ops/roles/nginx/defaults/main.yml").read_text())
    return {
        "nginx_worker_connections": int(defaults["nginx_worker_connections"]),
        "nginx_worker_rlimit_nofile": min(
            int(defaults["nginx_worker_rlimit_nofile"]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        ),
    }


class Reference:
    """floor or starlette: a broadcaster of bench/fanout_apps.py in a process of its own.
    With `redis_url`: the floor on Redis (`floor_redis`) on `workers` workers."""

    def __init__(self, name, streams, root, workers=1, redis_url=None, connections=None):
        self.name, self.port = name, free_port()
        self.stream_path, self.host, self.identity = "/stream", f"{HOST}:{self.port}", ""
        self.stream_port, self.workers = self.port, workers
        env = {**os.environ, "BENCH_REDIS_URL": redis_url} if redis_url else None
        if name == "floor":
            # -c /dev/null: not the services' gunicorn.conf.py, which this directory holds
            command = [
                str(VENV_BIN / "gunicorn"),
                "-c",
                "/dev/null",
                "-k",
                "gevent",
                "-w",
                str(workers),
                "--worker-connections",
                str(connections or streams + 1000),
                "--graceful-timeout",
                "2",
                "-b",
                f"{HOST}:{self.port}",
                "bench.fanout_apps:" + ("floor_redis" if redis_url else "floor"),
            ]
        else:
            command = [
                str(VENV_BIN / "uvicorn"),
                "bench.fanout_apps:starlette_app",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        self.log = open(root / f"{name}.log", "wb")
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.api = KeepAliveClient(self.port)
        try:
            wait_for(self._accepts, f"{name} to listen", START_TIMEOUT_S)
            # gunicorn: the arbiter's children are the workers; uvicorn serves in its own process.
            self.worker_pids = (
                wait_for(self._workers, "the workers", START_TIMEOUT_S) if name == "floor" else [self.process.pid]
            )
        except BaseException:
            self.stop()
            raise

    def _workers(self):
        pids = child_pids(self.process.pid)
        return pids if len(pids) >= self.workers else None

    @property
    def worker_pid(self):
        return self.worker_pids[0]

    def _accepts(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
        return accepts(self.port, HOST)

    def write(self, i):
        self.api.json("POST", "/publish", {"collection": "saved_prompts", "write": i})

    def stop(self):
        self.api.close()
        terminate(self.process, 20)
        self.log.close()


class Ours:
    """decks or wizard: the service as production runs it (devtools.services), on
    `workers` workers; `env` on top (REDIS_URL, WORKER_CONNECTIONS)."""

    def __init__(self, name, streams, root, workers=1, env=None):
        self.name = name
        data_dir = root / f"{name}-data"
        data_dir.mkdir()
        body = copy_sample_deck(data_dir) if name == "decks" else None
        self.service = Service(name, data_dir, root / f"{name}.log", workers=workers, env=env)
        self.port, self.worker_pids = self.service.port, self.service.worker_pids
        self.stream_port, self.host = self.port, f"{HOST}:{self.port}"
        # The wizard's identity: the proxy's trusted header, which a loopback caller may send.
        self.identity = "Remote-User: bench\r\n" if name == "wizard" else ""
        self.api = KeepAliveClient(self.port)
        self.session, self.write_path = None, "/api/collections/saved_prompts"
        if name == "decks":
            try:
                self.api.json("POST", "/api/decks/import", body)
                self.session = self.api.json("POST", "/api/sessions", {"deck_id": body["id"]})["id"]
            except BaseException:
                self.stop()
                raise
            self.write_path = f"/api/sessions/{self.session}/events"

    @property
    def worker_pid(self):
        return self.worker_pids[0]

    @property
    def stream_path(self):
        """The deck's stream opens after the events written so far, so that a stream
        replays nothing a write could be mistaken for."""
        if self.session is None:
            return "/api/events"
        last = self.api.json("GET", f"/api/sessions/{self.session}")["last_seq"]
        return f"/api/sessions/{self.session}/stream?after={last}"

    def write(self, i):
        if self.name == "decks":
            self.api.json("POST", self.write_path, {"type": "note", "slide": 0, "text": f"fan-out write {i}"})
        else:
            self.api.json("POST", self.write_path, {"text": f"fan-out write {i}"}, headers={"Remote-User": "bench"})

    def stop(self):
        self.api.close()
        self.service.stop()


class BehindNginx:
    """A target behind a real nginx (the production site: the wizard's for the floor
    and the wizard, the deck service's for decks; the playbook's limits), with its
    streams and writes going through nginx."""

    def __init__(self, target, root, streams, nginx_workers):
        self.target, self.name = target, target.name
        site = "decks" if target.name == "decks" else "wizard"
        variables = {
            **production_nginx_limits(),
            "nginx_worker_processes": nginx_workers,
        }
        self.proxy = devnginx.start(
            root / f"{target.name}-nginx", None, {site: f"{HOST}:{target.port}"}, variables=variables
        )
        self.proxy_pids = wait_for(self._nginx_workers(nginx_workers), "nginx's workers", START_TIMEOUT_S)
        self.stream_port, self.host = self.proxy.port, self.proxy.host(site)
        self.identity = ""  # nginx says who the visitor is (`public`, without a provider)
        self.worker_pids = target.worker_pids
        # Writes through nginx too, on a connection of their own.
        target.api.close()
        target.api = KeepAliveClient(self.proxy.port, self.host)
        if target.name == "wizard":
            target.write = self._write_wizard

    def _nginx_workers(self, count):
        def workers():
            pids = child_pids(self.proxy.process.pid)
            return pids if len(pids) >= count else None

        return workers

    def _write_wizard(self, i):
        self.target.api.json("POST", self.target.write_path, {"text": f"fan-out write {i}"}, expect=(201,))

    @property
    def stream_path(self):
        return self.target.stream_path

    def write(self, i):
        self.target.write(i)

    def stop(self):
        try:
            stop_nginx(self.proxy)
        finally:
            self.target.stop()


# --------------------------------------------------------------------------- streams


def send_until_open(sock: socket.socket, request: bytes, answer_ok: bytes | None = None) -> bytes:
    """Send a stream's request and read until its `: stream open` comment; what was read.
    With `answer_ok`, an answer whose first bytes differ (its status line) is a
    ConnectionError naming that line."""
    sock.sendall(request)
    seen = b""
    while b"stream open" not in seen:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before ': stream open'")
        seen += data
        if answer_ok and len(seen) >= len(answer_ok) and not seen.startswith(answer_ok):
            raise ConnectionError(seen.split(b"\r\n", 1)[0].decode("latin-1", "replace"))
    return seen


class Stream:
    """One SSE stream on a raw socket; counts the `data:` lines it reads and times its
    keepalive comments."""

    def __init__(self, fan, source):
        self.fan, self.source, self.records, self.opened, self.error = fan, source, 0, False, None
        self.opened_at, self.keepalives = None, []

    def run(self):
        fan, sock = self.fan, None
        try:
            with fan.open_slots:
                sock = socket.create_connection(
                    (HOST, fan.target.stream_port), timeout=OPEN_TIMEOUT_S, source_address=self.source
                )
                seen = send_until_open(sock, fan.request)
            sock.settimeout(None)
            self.opened, self.opened_at = True, time.perf_counter()
            fan.opened()
            tail = seen[-10:]
            while True:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                # A tail one byte shorter than what is counted cannot hold a whole one.
                count = (tail[-4:] + data).count(b"data:")
                keepalives = (tail + data).count(KEEPALIVE)
                tail = data[-10:] if len(data) >= 10 else (tail + data)[-10:]
                if keepalives:
                    self.keepalives.extend([time.perf_counter()] * keepalives)
                if count:
                    self.records += count
                    fan.arrived(self)
        except Exception as exc:  # counted in the report
            self.error = f"{type(exc).__name__}: {exc}"
            if not self.opened:
                fan.opened()
        finally:
            if sock is not None:
                sock.close()


def client_address(n, subnet):
    """The n-th of the client addresses 127.<subnet>.0.1, 127.<subnet>.0.2, ... (all of
    127/8 is this machine's loopback)."""
    return f"127.{subnet}.{n // 250}.{n % 250 + 1}"


class FanOut:
    """`spread`: the streams come from STREAMS_PER_ADDRESS each of the loopback
    addresses of 127.<spread>/16, as viewers come from many addresses (the deck site's
    limits are per address); None: from 127.0.0.1."""

    def __init__(self, target, streams, open_concurrency, spread=None):
        self.target, self.wanted = target, streams
        self.request = (
            f"GET {target.stream_path} HTTP/1.1\r\nHost: {target.host}\r\n{target.identity}"
            "Accept: text/event-stream\r\n\r\n"
        ).encode("latin-1")
        self.open_slots = BoundedSemaphore(open_concurrency)
        self.streams = [
            Stream(self, None if spread is None else (client_address(i // STREAMS_PER_ADDRESS, spread), 0))
            for i in range(streams)
        ]
        self.settled, self.all_settled = 0, Event()
        self.t0, self.arrivals, self.done = None, [], Event()
        self.greenlets = []

    def open(self):
        self.greenlets = [gevent.spawn(stream.run) for stream in self.streams]
        self.all_settled.wait(max(OPEN_TIMEOUT_S, self.wanted / 100))

    def opened(self):
        self.settled += 1
        if self.settled >= self.wanted:
            self.all_settled.set()

    def live(self):
        return [s for s in self.streams if s.opened and s.error is None]

    def expect(self):
        self.expected = len(self.live())
        self.arrivals, self.done = [], Event()
        for stream in self.streams:
            stream.before = stream.records
        if not self.expected:
            self.done.set()
        self.t0 = time.perf_counter()

    def arrived(self, stream):
        if self.t0 is not None and stream.records > stream.before and not getattr(stream, "got", False):
            stream.got = True
            self.arrivals.append(time.perf_counter() - self.t0)
            if len(self.arrivals) >= self.expected:
                self.done.set()

    def reset(self):
        for stream in self.streams:
            stream.got = False

    def close(self):
        gevent.killall(self.greenlets, timeout=10)


def measure(name, args, root):
    if name in ("floor", "starlette"):
        target = Reference(name, args.streams, root)
    else:
        target = Ours(name, args.streams, root, env={"WORKER_CONNECTIONS": str(args.streams + 1000)})
    fan = None
    try:
        warm = FanOut(target, 5, 5)  # first-request costs out of the figures
        warm.open()
        warm.expect()
        target.write(0)
        warm.done.wait(DELIVERY_TIMEOUT_S)
        warm.close()
        rss0 = proc_status_kb(target.worker_pid, "VmRSS")
        fan = FanOut(target, args.streams, args.open_concurrency)
        fan.open()
        live = len(fan.live())
        rss1 = proc_status_kb(target.worker_pid, "VmRSS")
        meter = CpuMeter([target.worker_pid]).start()
        latencies, worst, delivered, expected = [], None, 0, 0
        for i in range(1, args.writes + 1):
            fan.reset()
            fan.expect()
            target.write(i)
            fan.done.wait(DELIVERY_TIMEOUT_S)
            got = list(fan.arrivals)
            latencies.extend(got)
            delivered, expected = delivered + len(got), expected + fan.expected
            p99 = percentile(got, 99)
            worst = p99 if worst is None or (p99 or 0) > worst else worst
            gevent.sleep(args.gap)
        meter.stop()
        return {
            "name": name,
            "live": live,
            "wanted": args.streams,
            "kb_per_stream": (rss1 - rss0) / live if live and rss0 and rss1 else None,
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
            "worst_p99": worst,
            "delivered": delivered,
            "expected": expected,
            "cpu_per_write": meter.worker / args.writes,
            "errors": sorted({s.error for s in fan.streams if s.error})[:3],
        }
    finally:
        if fan is not None:
            fan.close()
        target.stop()


# --------------------------------------------------------------------------- one host (--nginx)


def rss_kb(pids):
    """The summed VmRSS of `pids` (None when one is gone)."""
    sizes = [proc_status_kb(pid, "VmRSS") for pid in pids]
    return None if None in sizes else sum(sizes)


def kb_per_stream(before, after, live):
    """The growth of an RSS (kB) per stream open (None when unknown)."""
    return (after - before) / live if live and before and after else None


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def keepalive_figures(streams):
    """Each live stream's keepalive comments: how many streams had fewer than two, the
    intervals between a stream's consecutive ones, and the first one's delay after open."""
    intervals, firsts, fewer = [], [], 0
    for stream in streams:
        times = stream.keepalives
        if len(times) < 2:
            fewer += 1
        if times:
            firsts.append(times[0] - stream.opened_at)
        intervals.extend(b - a for a, b in zip(times, times[1:]))
    low, high = KEEPALIVE_S * (1 - KEEPALIVE_TOLERANCE), KEEPALIVE_S * (1 + KEEPALIVE_TOLERANCE)
    return {
        "fewer_than_two": fewer,
        "intervals": len(intervals),
        "p1": percentile(intervals, 1),
        "p50": percentile(intervals, 50),
        "p99": percentile(intervals, 99),
        "max": max(intervals) if intervals else None,
        "first_max": max(firsts) if firsts else None,
        "off_schedule": sum(1 for x in intervals if not low <= x <= high)
        + sum(1 for x in firsts if not low <= x <= high),
    }


def start_host_target(name, args, root, redis_server):
    """`name` on args.workers workers (the floor and the wizard on a Redis database of
    their own), behind nginx."""
    if name == "floor":
        base = Reference(
            "floor",
            args.streams,
            root,
            workers=args.workers,
            redis_url=redis_server.new_url(),
            connections=production_worker_connections(),
        )
    else:
        env = {"REDIS_URL": redis_server.new_url()} if name == "wizard" else {}
        base = Ours(name, args.streams, root, workers=args.workers, env=env)
    try:
        return BehindNginx(base, root, args.streams, args.nginx_workers)
    except BaseException:
        base.stop()
        raise


def timed_writes(target, fan, args):
    """args.writes writes, one at a time: {latencies (all), worst_p99, delivered, expected,
    answers (each write's own answer time), firsts (each write's first receipt)}."""
    out = {"latencies": [], "worst_p99": None, "delivered": 0, "expected": 0, "answers": [], "firsts": []}
    for i in range(1, args.writes + 1):
        fan.reset()
        fan.expect()
        target.write(i)
        out["answers"].append(time.perf_counter() - fan.t0)
        fan.done.wait(DELIVERY_TIMEOUT_S)
        got = list(fan.arrivals)
        out["latencies"].extend(got)
        out["firsts"].extend(got[:1])
        out["delivered"] += len(got)
        out["expected"] += fan.expected
        p99 = percentile(got, 99)
        if out["worst_p99"] is None or (p99 or 0) > out["worst_p99"]:
            out["worst_p99"] = p99
        gevent.sleep(args.gap)
    return out


def hold(fan, seconds):
    """Keep the streams open until `seconds` have passed since the last one opened."""
    opened = [s.opened_at for s in fan.streams if s.opened_at is not None]
    if opened and seconds > 0:
        gevent.sleep(max(0.0, max(opened) + seconds - time.perf_counter()))


def measure_host(name, args, root, redis_server, hold_s):
    """One round of `name`: its streams opened, the timed writes, then (hold_s > 0) the
    streams held for their keepalives."""
    target = start_host_target(name, args, root, redis_server)
    fan = None
    try:
        warm = FanOut(target, 5, 5, spread=2)  # first-request costs out of the figures
        warm.open()
        warm.expect()
        target.write(0)
        warm.done.wait(DELIVERY_TIMEOUT_S)
        warm.close()
        services0, proxy0 = rss_kb(target.worker_pids), rss_kb(target.proxy_pids)
        fds0 = [open_fds(pid) for pid in target.worker_pids + target.proxy_pids]
        whole = CpuMeter(target.worker_pids, target.proxy_pids).start()
        fan = FanOut(target, args.streams, args.open_concurrency, spread=1)
        opening = time.perf_counter()
        fan.open()
        opening = time.perf_counter() - opening
        live = len(fan.live())
        services1, proxy1 = rss_kb(target.worker_pids), rss_kb(target.proxy_pids)
        fds1 = [open_fds(pid) for pid in target.worker_pids + target.proxy_pids]
        meter = CpuMeter(target.worker_pids, target.proxy_pids).start()
        writes = timed_writes(target, fan, args)
        latencies = writes["latencies"]
        meter.stop()
        hold(fan, hold_s)
        whole.stop()
        held = fan.live()
        split = [(b - a) if a is not None and b is not None else None for a, b in zip(fds0, fds1)]
        return {
            "name": name,
            "live": live,
            "held": len(held),
            "wanted": args.streams,
            "opening": opening,
            "kb_per_stream": kb_per_stream(services0, services1, live),
            "nginx_kb_per_stream": kb_per_stream(proxy0, proxy1, live),
            "nginx_rss_mb": (proxy1 or 0) / 1024,
            "services_rss_mb": (services1 or 0) / 1024,
            "worker_split": split[: len(target.worker_pids)],
            "nginx_split": split[len(target.worker_pids) :],
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
            "worst_p99": writes["worst_p99"],
            "delivered": writes["delivered"],
            "expected": writes["expected"],
            "cpu_per_write": meter.worker / args.writes,
            "nginx_per_write": meter.proxy / args.writes,
            "others_share": meter.other / meter.seconds if meter.seconds else 0.0,
            "latencies": latencies,
            "answers": writes["answers"],
            "firsts": writes["firsts"],
            "writes_cpu": meter,
            "whole_cpu": whole,
            # The floor sends no keepalives: nothing to time there.
            "keepalive": keepalive_figures(held) if hold_s > 0 and name != "floor" else None,
            "errors": sorted({s.error for s in fan.streams if s.error})[:3],
        }
    finally:
        if fan is not None:
            fan.close()
        target.stop()


def print_host_row(r):
    kb = "-" if r["kb_per_stream"] is None else f"{r['kb_per_stream']:.1f}"
    nkb = "-" if r["nginx_kb_per_stream"] is None else f"{r['nginx_kb_per_stream']:.1f}"
    print(
        f"   {r['name']:8} {r['live']:>7} {fmt_ms(r['p50']):>10} {fmt_ms(r['p99']):>10} {fmt_ms(r['max']):>10} "
        f"{fmt_ms(r['worst_p99']):>10} {kb:>9} {nkb:>9}  {r['delivered']}/{r['expected']}"
    )
    w, c = r["whole_cpu"], r["writes_cpu"]
    print(
        f"      the writes' own answers (POST sent -> answer read): p50 {fmt_ms(percentile(r['answers'], 50))}, "
        f"max {fmt_ms(max(r['answers']) if r['answers'] else None)}; first receipt of each write: p50 "
        f"{fmt_ms(percentile(r['firsts'], 50))}, max {fmt_ms(max(r['firsts']) if r['firsts'] else None)}"
    )
    print(
        f"      opened in {r['opening']:.1f} s; connections per service worker {r['worker_split']}, per nginx "
        f"worker {r['nginx_split']} (each stream is 2 there); RSS services {r['services_rss_mb']:.0f} MB, "
        f"nginx workers {r['nginx_rss_mb']:.0f} MB"
    )
    print(
        f"      CPU over the whole run ({w.seconds:.0f} s): services {w.worker:.1f} s, nginx {w.proxy:.1f} s, "
        f"client {w.client:.1f} s ({w.pct(w.client)} of one CPU), others {w.other:.1f} s, stolen {w.steal:.1f} s; "
        f"during the writes: services {c.worker:.1f} s, nginx {c.proxy:.1f} s, client {c.client:.1f} s "
        f"({c.pct(c.client)}), others {c.other:.1f} s"
    )
    k = r["keepalive"]
    if k is not None:
        print(
            f"      keepalives of the {r['held']} streams still open: intervals p1 {k['p1'] or 0:.2f} s, p50 "
            f"{k['p50'] or 0:.2f} s, p99 {k['p99'] or 0:.2f} s, max {k['max'] or 0:.2f} s ({k['intervals']} "
            f"intervals), first after open at most {k['first_max'] or 0:.2f} s; streams with fewer than two: "
            f"{k['fewer_than_two']}, off schedule (beyond {KEEPALIVE_TOLERANCE:.0%}): {k['off_schedule']}"
        )
    for error in r["errors"]:
        print(f"      error: {error}")


def merge_rounds_of(rounds):
    """One target's rounds as one figure: the latencies pooled, the largest memory per
    stream, the sums of deliveries, the first round's keepalives (only it holds)."""
    merged = dict(rounds[0])
    latencies = [x for r in rounds for x in r["latencies"]]

    def largest(key):
        values = [r[key] for r in rounds if r[key] is not None]
        return max(values) if values else None

    merged.update(
        p50=percentile(latencies, 50),
        p99=percentile(latencies, 99),
        max=max(latencies) if latencies else None,
        worst_p99=largest("worst_p99"),
        kb_per_stream=largest("kb_per_stream"),
        nginx_kb_per_stream=largest("nginx_kb_per_stream"),
        live=min(r["live"] for r in rounds),
        held=min(r["held"] for r in rounds if r["keepalive"] is not None) if merged["keepalive"] else merged["held"],
        delivered=sum(r["delivered"] for r in rounds),
        expected=sum(r["expected"] for r in rounds),
        cpu_per_write=sum(r["cpu_per_write"] for r in rounds) / len(rounds),
        nginx_per_write=sum(r["nginx_per_write"] for r in rounds) / len(rounds),
        others_share=sum(r["others_share"] for r in rounds) / len(rounds),
        round_p99s=[r["p99"] for r in rounds],
    )
    return merged


def report_host(results, args):
    print(
        f"\n-- {args.streams} streams over {args.workers} gunicorn workers behind nginx ({args.nginx_workers} "
        f"workers), {args.writes} writes {args.gap:g} s apart per round, {args.rounds} round(s) in alternating "
        f"order, the first held {args.hold:g} s --"
    )
    print(
        f"   {'target':8} {'streams':>7} {'p50':>10} {'p99':>10} {'max':>10} {'kB/stream':>9} {'nginx kB':>9} "
        f"{'CPU/write':>10} {'nginx':>8} {'others':>7}  delivered  p99 of each round"
    )
    for r in results.values():
        kb = "-" if r["kb_per_stream"] is None else f"{r['kb_per_stream']:.1f}"
        nkb = "-" if r["nginx_kb_per_stream"] is None else f"{r['nginx_kb_per_stream']:.1f}"
        print(
            f"   {r['name']:8} {r['live']:>7} {fmt_ms(r['p50']):>10} {fmt_ms(r['p99']):>10} {fmt_ms(r['max']):>10} "
            f"{kb:>9} {nkb:>9} {r['cpu_per_write'] * 1000:>7.0f} ms {r['nginx_per_write'] * 1000:>5.0f} ms "
            f"{r['others_share']:>7.0%}  {r['delivered']}/{r['expected']}  "
            + ", ".join(fmt_ms(x) for x in r["round_p99s"])
        )
    print(
        "   (CPU/write: the service's workers' CPU per write, both workers; nginx: its workers'; others: the CPU"
        " other processes of the machine took during the writes, in share of one CPU)"
    )
    floor, rows = results.get("floor"), []
    for name in ("decks", "wizard"):
        r = results.get(name)
        if r is None:
            continue
        complete = r["delivered"] == r["expected"] and r["expected"] > 0 and r["live"] == r["wanted"]
        if floor is not None and floor["p99"] and r["p99"]:
            ratio = r["p99"] / floor["p99"]
            # CPU times come in clock ticks (10 ms): a short run may count none.
            cpu = f"{r['cpu_per_write'] / floor['cpu_per_write']:.2f} x" if floor["cpu_per_write"] else "-"
            rows.append(
                (
                    f"{name}: p99 write -> last receipt vs floor",
                    f"{ratio:.2f} x floor ({fmt_ms(r['p99'])} / {fmt_ms(floor['p99'])}); CPU/write {cpu} floor's",
                    "<= 1.3 x",
                    ratio <= 1.3 and complete,
                )
            )
        rows.append(
            (
                f"{name}: memory per stream in the service",
                "-"
                if r["kb_per_stream"] is None
                else f"{r['kb_per_stream']:.1f} kB (floor {(floor or {}).get('kb_per_stream') or 0:.1f}; "
                f"nginx {r['nginx_kb_per_stream'] or 0:.1f})",
                "<= 25 kB",
                r["kb_per_stream"] is not None and r["kb_per_stream"] <= 25,
            )
        )
        k = r["keepalive"]
        if k is not None:
            rows.append(
                (
                    f"{name}: keepalives every {KEEPALIVE_S:g} s",
                    f"{k['intervals']} intervals, p1 {k['p1'] or 0:.1f} s, max {k['max'] or 0:.1f} s, "
                    f"{k['off_schedule']} off",
                    f"all within {KEEPALIVE_TOLERANCE:.0%}",
                    k["off_schedule"] == 0 and k["fewer_than_two"] == 0 and r["held"] == r["live"],
                )
            )
    print_targets(rows)


def run_host(args):
    """--nginx: each target in turn on args.workers workers behind nginx, in args.rounds
    rounds, the order reversed every other round (drift and the machine's other load
    weigh on every target alike); only the first round holds the streams."""
    rounds = {name: [] for name in args.targets}
    with tempfile.TemporaryDirectory(prefix="bench-fanout-host-") as tmp, RedisServer() as redis_server:
        root = Path(tmp)
        for n in range(args.rounds):
            for name in args.targets if n % 2 == 0 else reversed(args.targets):
                print(
                    f"== round {n + 1}, {name}: {args.streams} streams, {args.workers} workers, through nginx ==",
                    flush=True,
                )
                folder = root / f"round-{n + 1}"
                folder.mkdir(exist_ok=True)
                result = measure_host(name, args, folder, redis_server, args.hold if n == 0 else 0.0)
                rounds[name].append(result)
                print_host_row(result)
    report_host({name: merge_rounds_of(results) for name, results in rounds.items()}, args)


def report(results, args):
    print(f"\n-- {args.streams} streams on one worker, {args.writes} writes {args.gap:g} s apart --")
    print(
        f"   {'target':10} {'streams':>8} {'p50':>10} {'p99':>10} {'max':>10} {'worst p99':>10} "
        f"{'kB/stream':>10} {'CPU/write':>10}  delivered"
    )
    for r in results.values():
        kb = "-" if r["kb_per_stream"] is None else f"{r['kb_per_stream']:.1f}"
        print(
            f"   {r['name']:10} {r['live']:>8} {fmt_ms(r['p50']):>10} {fmt_ms(r['p99']):>10} "
            f"{fmt_ms(r['max']):>10} {fmt_ms(r['worst_p99']):>10} {kb:>10} "
            f"{r['cpu_per_write'] * 1000:>7.0f} ms  {r['delivered']}/{r['expected']}"
        )
        for error in r["errors"]:
            print(f"      error: {error}")
    floor, starlette = results.get("floor"), results.get("starlette")
    rows = []
    for name in ("decks", "wizard"):
        r = results.get(name)
        if r is None or floor is None or not floor["p99"] or not r["p99"]:
            continue
        ratio = r["p99"] / floor["p99"]
        below = starlette is None or not starlette["p99"] or r["p99"] < starlette["p99"]
        small = r["kb_per_stream"] is not None and r["kb_per_stream"] <= 25
        complete = r["delivered"] == r["expected"] and r["expected"] > 0
        rows.append(
            (
                f"{name}: p99 vs floor" + (", vs Starlette" if starlette else ""),
                f"{ratio:.2f} x floor ({fmt_ms(r['p99'])} / {fmt_ms(floor['p99'])})"
                + (f", Starlette {fmt_ms(starlette['p99'])}" if starlette else ""),
                "<= 1.3 x, below Starlette",
                ratio <= 1.3 and below and complete,
            )
        )
        rows.append(
            (
                f"{name}: memory per stream",
                "-"
                if r["kb_per_stream"] is None
                else f"{r['kb_per_stream']:.1f} kB (floor {floor['kb_per_stream'] or 0:.1f})",
                "<= 25 kB",
                small,
            )
        )
    print_targets(rows)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 200 streams, 3 writes (--nginx: no hold)")
    p.add_argument("--nginx", action="store_true", help="one host: --workers workers behind nginx (10,000 streams)")
    p.add_argument("--streams", type=int, help="open streams (default 5,000; --nginx: 10,000)")
    p.add_argument("--workers", type=int, default=2, help="--nginx: gunicorn workers per target (default 2)")
    p.add_argument("--nginx-workers", type=int, default=2, help="--nginx: nginx's worker processes (default 2)")
    p.add_argument(
        "--hold", type=float, default=60.0, help="--nginx: seconds the streams stay open for the keepalives (60)"
    )
    p.add_argument("--rounds", type=int, default=1, help="--nginx: rounds of every target (default 1)")
    p.add_argument("--writes", type=int, default=10)
    p.add_argument("--gap", type=float, default=0.3, help="seconds between two writes (default 0.3)")
    p.add_argument("--open-concurrency", type=int, default=100)
    p.add_argument("--only", help=f"comma-separated targets (of {', '.join(TARGETS)})")
    args = p.parse_args(argv)
    if args.streams is None:
        args.streams = 10000 if args.nginx else 5000
    if args.quick:
        args.streams, args.writes, args.hold = 200, 3, 0.0
    known = HOST_TARGETS if args.nginx else TARGETS
    args.targets = [t for t in (args.only.split(",") if args.only else known)]
    unknown = set(args.targets) - set(known)
    if unknown:
        p.error(f"unknown target(s){' with --nginx' if args.nginx else ''}: {', '.join(sorted(unknown))}")
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    # This client holds a socket per stream; gunicorn and nginx inherit the limit (nginx
    # raises its workers' own to worker_rlimit_nofile where it may).
    soft, _ = raise_nofile(args.streams * 2 + 1000)
    print(run_header("fan-out benchmark" + (" (one host, nginx)" if args.nginx else ""), args.quick), flush=True)
    if soft < args.streams + 200:
        sys.exit(f"RLIMIT_NOFILE is {soft}: {args.streams} streams need more")
    if args.nginx:
        print(
            f"   RLIMIT_NOFILE {soft}; gunicorn's worker_connections {production_worker_connections()} (its default), "
            + ", ".join(f"{k[6:]} {v}" for k, v in production_nginx_limits().items())
            + " (the playbook's; the open files capped at this machine's hard limit)",
            flush=True,
        )
        run_host(args)
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        root = Path(tmp)
        for name in args.targets:
            print(f"== {name}: {args.streams} streams ==", flush=True)
            results[name] = measure(name, args, root)
    report(results, args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
