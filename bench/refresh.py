"""The refresh that follows every event (issue 18): N open wizard pages re-read the blueprint
list after each `{"collection": "blueprints"}` event, everything through nginx. Run by hand:

    .venv/bin/python -m bench.refresh                 # 1,000 pages, 1,000 rows, 3 rounds
    .venv/bin/python -m bench.refresh --quick         # 100 pages, 200 rows, 2 rounds (smoke run)
    .venv/bin/python -m bench.refresh --lists-by-service   # the service sends the lists itself

A page here is what the wizard's blueprint page holds: an SSE stream on /api/events and a
keep-alive connection, both through nginx (production's site, every visitor `public`), and
the list it last read with its ETag, which it sends back as If-None-Match (as a browser's
cache does for a `no-cache` answer). The service is one gunicorn gevent worker on SQLite; R
public blueprints are seeded first. nginx sends the pages the anonymous view the service
published (app/wizard/public_lists.py); with --lists-by-service the site has no lists
folder, nothing is published and the worker answers every re-read itself.

Each round times three segments, from one instant to the moment the last page is done:
- static (the reference): every page GETs, at once, a file of the list's size that nginx
  serves from the uploads folder by itself;
- changed: a public blueprint is posted through nginx; timed from just before the POST
  until every page has received the event and read the new list (200);
- unchanged: another user's private blueprint is posted (straight to gunicorn, trusted
  Remote-User): every page is told and asks again, and is answered 304 (its view did not
  change).
The figure is each segment's time over the static one in the same round (medians over the
rounds), with the CPU of the worker, nginx and this client. The goal: changed <= 2 x static.

The clients run in this process on gevent, on the same CPUs as nginx and the service.
Prints figures; asserts nothing; never collected as a test.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/refresh.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HttpError,
    KeepAliveClient,
    build_request,
    exit_on_sigterm,
    fmt_ms,
    print_targets,
    raise_nofile,
    run_header,
)
from bench.wizard import LIST, BodyClient, FanOut, Stack, StreamClient, blueprint, seed_rows  # noqa: E402

COLLECTION = "blueprints"
TARGET_PAGES = 1000
TARGET_RATIO = 2.0
SEGMENT_TIMEOUT_S = 60.0  # one segment: every page done
PAGE_IDLE_S = 60.0  # a page's connection is reused while idle (nginx keeps it 65 s)


class Page(StreamClient):
    """A stream that, on each event of the list's collection, reads the list again on its
    own keep-alive connection (with If-None-Match) before reporting to the bench."""

    __slots__ = ("client", "etag", "statuses")

    def __init__(self, fan):
        super().__init__(fan)
        self.client = BodyClient(fan.port)
        self.client.MAX_IDLE_S = PAGE_IDLE_S
        self.etag = None
        self.statuses = Counter()

    def read_list(self):
        headers = {"If-None-Match": self.etag} if self.etag else None
        status, _, first = self.client.send(build_request("GET", LIST, self.fan.host, headers))
        self.statuses[status] += 1
        if status == 200:
            self.etag = self.client.etag
        elif status != 304:
            raise HttpError(f"GET {LIST} -> {status}: {first!r}")
        return status

    def _dispatch(self):
        fan = self.fan
        event = json.loads(b"\n".join(self.rec_data))
        if event.get("collection") != COLLECTION or fan.current is None:
            self.others += 1
            return
        if self.last_write == fan.current:
            self.duplicates += 1
            return
        self.last_write = fan.current
        self.received += 1
        self.read_list()  # in this stream's greenlet: the next events wait in the socket
        fan.arrived(time.perf_counter())


class Pages(FanOut):
    def __init__(self, port, host, open_concurrency):
        super().__init__(port, host, open_concurrency)
        self.host = host

    def open(self, count):
        self.target_open = count
        for _ in range(count):
            page = Page(self)
            self.streams.append(page)
            self.greenlets.append(gevent.spawn(page.run))
        self.all_opened.wait(180)

    def live_pages(self):
        return [p for p in self.streams if p.opened and not p.ended and not p.error]

    def close(self):
        super().close()
        for page in self.streams:
            page.client.close()


def timed_static(pages, raw, size):
    """Every page GETs the static file at once: seconds until the last has it all."""
    start, finished, bad = Event(), [], Counter()

    def one(page):
        start.wait()
        status, length, _ = page.client.send(raw)
        finished.append(time.perf_counter())
        if status != 200 or length != size:
            bad[(status, length)] += 1

    greenlets = [gevent.spawn(one, page) for page in pages]
    gevent.sleep(0.1)  # every greenlet waits on `start`
    t0 = time.perf_counter()
    start.set()
    gevent.joinall(greenlets, timeout=SEGMENT_TIMEOUT_S)
    gevent.killall(greenlets, timeout=5)
    return (max(finished) - t0 if len(finished) == len(pages) else None), bad


def timed_write(fan, index, post):
    """`post()` a write; seconds until every live page has read the list again."""
    before = Counter()
    for page in fan.streams:
        before.update(page.statuses)
    fan.expect(index)
    t0 = time.perf_counter()
    post()
    fan.done.wait(SEGMENT_TIMEOUT_S)
    after = Counter()
    for page in fan.streams:
        after.update(page.statuses)
    got = len(fan.arrivals)
    return (max(fan.arrivals) - t0 if got and got >= fan.expected else None), after - before, got, fan.expected


def run(args, root):
    stack = Stack(root, "refresh", 1, max(1024, 4 * args.pages + 256), lists_via_nginx=not args.lists_by_service)
    fan = None
    public = KeepAliveClient(stack.proxy.port, stack.host)
    author = KeepAliveClient(stack.service.port)
    rng = random.Random(18)
    try:
        print(f"   {stack.describe()}; lists sent by {'the service' if args.lists_by_service else 'nginx'}", flush=True)
        seed_rows(stack.service.port, args.rows)
        status, _, body = public.request("GET", LIST)
        if status != 200:
            raise HttpError(f"GET {LIST} -> {status}")
        size = len(body)
        name = f"{uuid.uuid4().hex}.webp"
        (stack.uploads_dir / name).write_bytes(os.urandom(size))
        static = build_request("GET", f"/uploads/{name}", stack.host)
        print(f"   the list: {args.rows} rows, {size} bytes; the static file: the same size", flush=True)

        fan = Pages(stack.proxy.port, stack.host, args.open_concurrency)
        fan.open(args.pages)
        pages = fan.live_pages()
        loads = [gevent.spawn(page.read_list) for page in pages]
        gevent.joinall(loads, raise_error=True)
        print(f"   {len(pages)}/{args.pages} pages open, each holding the list and its ETag", flush=True)

        def post_public():
            public.json("POST", LIST, {**blueprint(rng.randrange(10**6), rng), "is_public": True}, expect=(201,))

        def post_private():
            author.json(
                "POST",
                LIST,
                {**blueprint(rng.randrange(10**6), rng), "is_public": False},
                headers={"Remote-User": "ada"},
                expect=(201,),
            )

        rounds, write_index = [], 0
        for number in range(1, args.rounds + 1):
            figures = {}
            for segment in ("static", "changed", "unchanged"):
                meter = stack.meter().start()
                if segment == "static":
                    seconds, outcome = timed_static(pages, static, size)
                    done = f"{len(pages) - sum(outcome.values())}/{len(pages)} whole"
                else:
                    write_index += 1
                    seconds, outcome, got, expected = timed_write(
                        fan, write_index, post_public if segment == "changed" else post_private
                    )
                    done = f"{got}/{expected} pages, answers {dict(outcome)}"
                meter.stop()
                figures[segment] = (seconds, meter)
                print(
                    f"   round {number} {segment:9}: {fmt_ms(seconds)} ({done}); CPU worker "
                    f"{meter.worker * 1000:.0f} ms, nginx {meter.proxy * 1000:.0f} ms, client "
                    f"{meter.client * 1000:.0f} ms" + ("  DISTURBED" if meter.disturbed() else ""),
                    flush=True,
                )
            rounds.append(figures)
        for error, count in fan.errors().most_common(5):
            print(f"   {count} page(s) failed: {error}")
        return {"rounds": rounds, "pages": len(pages), "size": size}
    except BaseException:
        print(stack.log_tails(), file=sys.stderr)
        raise
    finally:
        public.close()
        author.close()
        if fan is not None:
            fan.close()
        stack.stop()


def ratio(figures, segment):
    seconds, reference = figures[segment][0], figures["static"][0]
    return seconds / reference if seconds and reference else None


def summarize(result, args):
    rounds = result["rounds"]
    print(f"\n== Summary: {result['pages']} pages, a list of {result['size'] / 1024:.0f} kB, {len(rounds)} rounds ==")
    rows = []
    for segment in ("changed", "unchanged"):
        ratios = [r for r in (ratio(figures, segment) for figures in rounds) if r is not None]
        median = statistics.median(ratios) if len(ratios) == len(rounds) else None
        times = ", ".join(f"{fmt_ms(f[segment][0])} / {fmt_ms(f['static'][0])}" for f in rounds)
        goal = f"<= {TARGET_RATIO:g} x static" if segment == "changed" else "(figure)"
        ok = (median is not None and median <= TARGET_RATIO) if segment == "changed" else None
        rows.append(
            (
                f"write -> last page holds the list, view {segment}",
                f"median {median:.2f} x static ({times})" if median else f"incomplete ({times})",
                goal,
                ok,
            )
        )
    print_targets(rows)
    if args.quick:
        print("(quick smoke run: fewer pages and rows than the target)")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.refresh", description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=TARGET_PAGES, help=f"open pages (default {TARGET_PAGES})")
    p.add_argument("--rows", type=int, default=1000, help="public blueprints in the list (default 1000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three segments (default 3)")
    p.add_argument("--open-concurrency", type=int, default=100, help="streams being opened at once (default 100)")
    p.add_argument(
        "--lists-by-service",
        action="store_true",
        help="the site without wizard_lists_dir: the service sends each list itself",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 100 pages, 200 rows, 2 rounds")
    p.add_argument("--tmp-dir", help="parent of the temporary DATA_DIR (default: the system's)")
    args = p.parse_args(argv)
    if args.quick:
        args.pages, args.rows, args.rounds = 100, 200, 2
    for name in ("pages", "rows", "rounds", "open_concurrency"):
        if not 1 <= getattr(args, name) <= 20_000:
            p.error(f"--{name.replace('_', '-')} must be between 1 and 20000")
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    soft, _ = raise_nofile()
    if soft < 4 * args.pages + 200:
        sys.exit(f"RLIMIT_NOFILE is {soft}: too low for {args.pages} pages (each holds two connections)")
    root = Path(tempfile.mkdtemp(prefix="bench-refresh-", dir=args.tmp_dir))
    print(
        f"{run_header('refresh after an event', args.quick)}; {args.pages} pages, {args.rows} rows, "
        f"{args.rounds} rounds",
        flush=True,
    )
    try:
        summarize(run(args, root), args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
