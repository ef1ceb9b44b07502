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
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
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
)
from devtools.services import accepts, free_port, terminate  # noqa: E402
from devtools.waiting import wait_for  # noqa: E402
from tests.support.decks import copy_sample_deck  # noqa: E402

TARGETS = ("floor", "starlette", "decks", "wizard")
OPEN_TIMEOUT_S = 60.0  # every stream connected and told ': stream open'
DELIVERY_TIMEOUT_S = 30.0  # one write reaching every stream
START_TIMEOUT_S = 30.0
VENV_BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------- targets


class Reference:
    """floor or starlette: a broadcaster of bench/fanout_apps.py in a process of its own."""

    def __init__(self, name, streams, root):
        self.name, self.port = name, free_port()
        self.stream_path, self.host, self.identity = "/stream", f"{HOST}:{self.port}", ""
        if name == "floor":
            # -c /dev/null: not the services' gunicorn.conf.py, which this directory holds
            command = [
                str(VENV_BIN / "gunicorn"),
                "-c",
                "/dev/null",
                "-k",
                "gevent",
                "-w",
                "1",
                "--worker-connections",
                str(streams + 1000),
                "--graceful-timeout",
                "2",
                "-b",
                f"{HOST}:{self.port}",
                "bench.fanout_apps:floor",
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
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.api = KeepAliveClient(self.port)
        try:
            wait_for(self._accepts, f"{name} to listen", START_TIMEOUT_S)
            # gunicorn: the arbiter's one child is the worker; uvicorn serves in its own process.
            self.worker_pid = (
                wait_for(lambda: child_pids(self.process.pid), "the worker", START_TIMEOUT_S)[0]
                if name == "floor"
                else self.process.pid
            )
        except BaseException:
            self.stop()
            raise

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
    """decks or wizard: the service as production runs it (devtools.services, one worker)."""

    def __init__(self, name, streams, root):
        self.name = name
        data_dir = root / f"{name}-data"
        data_dir.mkdir()
        body = copy_sample_deck(data_dir) if name == "decks" else None
        self.service = Service(name, data_dir, root / f"{name}.log", env={"WORKER_CONNECTIONS": str(streams + 1000)})
        self.port, self.worker_pid = self.service.port, self.service.worker_pid
        self.host = f"{HOST}:{self.port}"
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


# --------------------------------------------------------------------------- streams


class Stream:
    """One SSE stream on a raw socket; counts the `data:` lines it reads."""

    def __init__(self, fan):
        self.fan, self.records, self.opened, self.error = fan, 0, False, None

    def run(self):
        fan, sock = self.fan, None
        try:
            with fan.open_slots:
                sock = socket.create_connection((HOST, fan.target.port), timeout=OPEN_TIMEOUT_S)
                sock.sendall(fan.request)
                seen = b""
                while b"stream open" not in seen:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("closed before ': stream open'")
                    seen += data
            sock.settimeout(None)
            self.opened = True
            fan.opened()
            tail = seen[-4:]
            while True:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                count = (tail + data).count(b"data:")  # a 4-byte tail cannot hold a whole "data:"
                tail = data[-4:]
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


class FanOut:
    def __init__(self, target, streams, open_concurrency):
        self.target, self.wanted = target, streams
        self.request = (
            f"GET {target.stream_path} HTTP/1.1\r\nHost: {target.host}\r\n{target.identity}"
            "Accept: text/event-stream\r\n\r\n"
        ).encode("latin-1")
        self.open_slots = BoundedSemaphore(open_concurrency)
        self.streams = [Stream(self) for _ in range(streams)]
        self.settled, self.all_settled = 0, Event()
        self.t0, self.arrivals, self.done = None, [], Event()
        self.greenlets = []

    def open(self):
        self.greenlets = [gevent.spawn(stream.run) for stream in self.streams]
        self.all_settled.wait(OPEN_TIMEOUT_S)

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
    target = (Reference if name in ("floor", "starlette") else Ours)(name, args.streams, root)
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
    p.add_argument("--quick", action="store_true", help="smoke run: 200 streams, 3 writes")
    p.add_argument("--streams", type=int, default=5000)
    p.add_argument("--writes", type=int, default=10)
    p.add_argument("--gap", type=float, default=0.3, help="seconds between two writes (default 0.3)")
    p.add_argument("--open-concurrency", type=int, default=100)
    p.add_argument("--only", help=f"comma-separated targets (of {', '.join(TARGETS)})")
    args = p.parse_args(argv)
    if args.quick:
        args.streams, args.writes = 200, 3
    args.targets = [t for t in (args.only.split(",") if args.only else TARGETS)]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        p.error(f"unknown target(s): {', '.join(sorted(unknown))}")
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    soft, _ = raise_nofile()
    print(run_header("fan-out benchmark", args.quick), flush=True)
    if soft < args.streams + 200:
        sys.exit(f"RLIMIT_NOFILE is {soft}: {args.streams} streams need more")
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
