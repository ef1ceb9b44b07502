"""A reconnect storm: N wizard pages come back at once after `systemctl restart`. Run by hand:

    .venv/bin/python -m bench.storm              # full run (10,000 pages)
    .venv/bin/python -m bench.storm --quick      # smoke run (200 pages)

The wizard runs as production runs it on one host: 2 gunicorn workers on Redis (its own
server), behind a real nginx with the playbook's limits (bench.fanout's BehindNginx),
on a socket the bench holds as systemd's bundle@.socket does, so a restart refuses no
connection (devtools.services: `restart()` stops gunicorn and starts it again on the
same socket; what arrives meanwhile waits in the kernel's queue).

Each page is what a browser's EventSource does with `/api/events`: it opens the stream
through nginx (from one of many loopback addresses, as visitors come from many), reads
the `retry:` the stream gives (app.common.sse: drawn per stream), and when the stream
ends, waits that long and opens it again; an answer other than 200 makes the page's own
code (app/wizard/static/common.js) try again 5 s later, and counts as a failure. Meanwhile
a steady load of ordinary requests (`GET /api/collections/wizards`, a page's first read)
goes through nginx; any answer but 200 counts as a failure.

Printed: how long the stop took, seconds from the restart until every page is back
(and the quantiles of the pages' own reconnection times), failed page opens, and the
ordinary requests' failures and latency before and during the storm, with the CPU the
bench's own client took (it shares the 2 cores). It asserts nothing and is never
collected as a test.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from gevent.lock import BoundedSemaphore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/storm.py`
    sys.path.insert(0, str(ROOT))

from bench.common import HOST, KeepAliveClient, exit_on_sigterm, fmt_ms, percentile, raise_nofile, run_header  # noqa: E402
from bench.fanout import STREAMS_PER_ADDRESS, BehindNginx, Ours, client_address, send_until_open  # noqa: E402
from devtools.redis_server import RedisServer  # noqa: E402

PAGE_RETRY_AFTER_FAILURE_S = 5.0  # app/wizard/static/common.js: setTimeout(connectEvents, 5000)
DEFAULT_RETRY_MS = 3000  # a browser's own, before a stream said its `retry:`
RETRY = re.compile(rb"retry: (\d+)")
END_OF_BODY = b"\r\n0\r\n\r\n"  # nginx's last chunk: the stream ended
OPEN_TIMEOUT_S = 120.0
BACK_TIMEOUT_S = 300.0


class Page:
    """One browser tab's EventSource on /api/events."""

    def __init__(self, storm, source):
        self.storm, self.source = storm, source
        self.opens, self.failures, self.retry_ms = 0, Counter(), DEFAULT_RETRY_MS
        self.back_at = None  # when it was open again after the restart

    def run(self):
        while not self.storm.stopping:
            ended_cleanly = self._one_stream()
            if self.storm.stopping:
                return
            gevent.sleep(self.retry_ms / 1000 if ended_cleanly else PAGE_RETRY_AFTER_FAILURE_S)

    def _one_stream(self):
        """Open, read until the stream ends; True when it ended after a 200 (a browser
        then reconnects after `retry:`), False when the open failed."""
        storm, sock = self.storm, None
        try:
            with storm.open_slots:
                sock = socket.create_connection((HOST, storm.port), timeout=60, source_address=self.source)
                seen = send_until_open(sock, storm.request, answer_ok=b"HTTP/1.1 200")
            self.opens += 1
            if storm.restarted_at is not None and self.back_at is None:
                self.back_at = time.monotonic()
                storm.came_back()
            storm.opened()
            sock.settimeout(None)
            tail = seen
            while True:
                match = RETRY.search(tail)
                if match:
                    self.retry_ms = int(match.group(1))
                if END_OF_BODY in tail:
                    return True
                data = sock.recv(65536)
                if not data:
                    return True
                tail = tail[-16:] + data
        except (OSError, ConnectionError) as exc:
            if not storm.stopping:
                self.failures[str(exc)[:60] or type(exc).__name__] += 1
            return False
        finally:
            if sock is not None:
                sock.close()


class Storm:
    def __init__(self, target, pages, open_concurrency):
        self.target, self.port = target, target.stream_port
        self.request = f"GET /api/events HTTP/1.1\r\nHost: {target.host}\r\nAccept: text/event-stream\r\n\r\n".encode()
        self.open_slots = BoundedSemaphore(open_concurrency)
        self.pages = [Page(self, (client_address(i // STREAMS_PER_ADDRESS, 40), 0)) for i in range(pages)]
        self.stopping, self.restarted_at = False, None
        self.open_count, self.back_count = 0, 0
        self.all_open, self.all_back = Event(), Event()
        self.greenlets = []

    def start(self):
        self.greenlets = [gevent.spawn(page.run) for page in self.pages]

    def opened(self):
        self.open_count += 1
        if self.open_count >= len(self.pages):
            self.all_open.set()

    def came_back(self):
        self.back_count += 1
        if self.back_count >= len(self.pages):
            self.all_back.set()

    def stop(self):
        self.stopping = True
        gevent.killall(self.greenlets, timeout=10)


class Users:
    """Ordinary requests at a steady rate through nginx: their latencies and failures, by phase."""

    def __init__(self, target, rate):
        self.target, self.rate, self.phase = target, rate, "before"
        self.latencies, self.failures = {}, {}
        self.running = True

    def run(self):
        gap, next_at = 1.0 / self.rate, time.monotonic()
        while self.running:  # open loop: a slow answer does not slow the next request
            next_at += gap
            gevent.spawn(self._one)
            gevent.sleep(max(0.0, next_at - time.monotonic()))

    def _one(self):
        phase, started = self.phase, time.perf_counter()
        client = KeepAliveClient(self.target.stream_port, self.target.host)
        try:
            client.json("GET", "/api/collections/wizards", expect=(200,))
            self.latencies.setdefault(phase, []).append(time.perf_counter() - started)
        except Exception as exc:  # counted: any answer but 200, any error
            key = str(exc)[:60] or type(exc).__name__
            self.failures.setdefault(phase, Counter())[key] += 1
        finally:
            client.close()


def run(args, root):
    with RedisServer() as redis_server:
        base = Ours("wizard", args.pages, root, workers=2, env={"REDIS_URL": redis_server.new_url()})
        target = BehindNginx(base, root, args.pages, 2)
        try:
            storm = Storm(target, args.pages, args.open_concurrency)
            users = Users(target, args.rate)
            users_loop = gevent.spawn(users.run)
            opening = time.monotonic()
            storm.start()
            if not storm.all_open.wait(OPEN_TIMEOUT_S):
                print(f"   only {storm.open_count} of {args.pages} pages opened within {OPEN_TIMEOUT_S:.0f} s")
                return
            print(f"   {args.pages:,} pages open through nginx in {time.monotonic() - opening:.1f} s")
            gevent.sleep(args.settle)
            users.phase = "storm"
            storm.restarted_at = time.monotonic()
            stop_took = base.service.running.restart()
            restarted = time.monotonic() - storm.restarted_at
            back = storm.all_back.wait(BACK_TIMEOUT_S)
            took = time.monotonic() - storm.restarted_at
            gevent.sleep(args.settle)
            users.running = False
            users_loop.join(timeout=10)
            storm.stop()
            report(args, storm, users, stop_took, restarted, took if back else None)
        finally:
            target.stop()


def report(args, storm, users, stop_took, restarted, took):
    backs = sorted(page.back_at - storm.restarted_at for page in storm.pages if page.back_at is not None)
    failures = sum((page.failures for page in storm.pages), Counter())
    print(
        f"   restart: the old workers stopped in {stop_took:.1f} s, the new ones ready {restarted:.1f} s after it began"
    )
    if took is None:
        print(f"   pages back: only {len(backs):,} of {args.pages:,} within {BACK_TIMEOUT_S:.0f} s")
    else:
        print(f"   pages back: all {args.pages:,} within {took:.1f} s of the restart")
    if backs:
        quantiles = ", ".join(f"p{p} {percentile(backs, p):.1f} s" for p in (50, 90, 99))
        print(f"   a page's time back: {quantiles}, last {backs[-1]:.1f} s")
    print(f"   failed page opens: {sum(failures.values())} {dict(failures.most_common(5))}")
    for phase in ("before", "storm"):
        done, failed = users.latencies.get(phase, []), users.failures.get(phase, Counter())
        figures = ", ".join(f"p{p} {fmt_ms(percentile(done, p))}" for p in (50, 95, 99)) if done else "-"
        print(
            f"   ordinary requests {phase:6s}: {len(done)} answered, {sum(failed.values())} failed"
            f" {dict(failed.most_common(3))}; {figures}"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 pages")
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=20, help="ordinary requests per second (default 20)")
    parser.add_argument("--settle", type=float, default=5, help="seconds before the restart and after the storm")
    parser.add_argument("--open-concurrency", type=int, default=200)
    args = parser.parse_args(argv)
    if args.quick:
        args.pages, args.settle = 200, 1
    exit_on_sigterm()
    raise_nofile()
    print(run_header("reconnect storm (wizard pages)", args.quick))
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
        run(args, Path(tmp))


if __name__ == "__main__":
    main()
