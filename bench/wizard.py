"""Prompt wizard benchmark: the blueprint list beside a static file, and collection-event fan-out. Run by hand:

    .venv/bin/python -m bench.wizard            # full run (3 rounds of 5 s per route, 1,000 streams, 5 writes)
    .venv/bin/python -m bench.wizard --quick    # smoke run (2 rounds of 1.5 s, 200 streams, 3 writes)
    .venv/bin/python -m bench.wizard --only list     # one phase: list or fanout
    .venv/bin/python bench/wizard.py --help

It starts the wizard service itself with devtools.services.start (gunicorn, one
gevent worker by default, exactly as production), each phase on a fresh temporary
DATA_DIR, puts a real nginx in front of it (devtools.nginx.start, the production
site template without a forward-auth provider, so every visitor is `public`;
requests carry `Host: wizard.localhost`), talks to 127.0.0.1 only, prints figures
and a verdict per target, and stops nginx and the service whatever happens. It
asserts nothing and is never collected as a test.

Phase 1, list: R rows (default 1,000) of `blueprints`, each public and shaped like
a real one (title, a ~150-character description, a cover_url "/uploads/<uuid>.webp",
tags, is_public), are posted straight to gunicorn by a few authors (trusted
`Remote-User` headers, as a loopback caller may send). The list as `public` sees it
is fetched once to learn its exact size, and a file of that size is written into
the uploads folder that nginx serves itself (`wizard_uploads_dir`: nginx answers
/uploads/<32 hex>.webp from the folder with sendfile, without the service). Then C
keep-alive clients (default 50) send back-to-back requests for S seconds to
`GET /api/collections/blueprints` through nginx, to the static file through nginx,
and to the list straight to gunicorn (`Remote-User: public`, the same answer), in R
rounds (ABBA order, to even out drift). requests/s, p50/p99 latency, CPU per request
of the worker, nginx and this client; every answer must be a 200 of the exact size.
The ratio is list req/s over static req/s, both through nginx. Through nginx the
anonymous list is the view the service published (app/wizard/public_lists.py), sent by
nginx alone; "list direct" is the service's own path.

The service keeps the list's JSON text per collection version (app/wizard/cache.py),
so once warmed every measured request is served from that cache: the figures are
the steady state of an unchanged collection (a version read, a lookup, a 400 kB
write), not the cost of building the list. That cost is printed apart: the list
fetched alone right after a write (which raises the version), against the same
fetch from the cache.

Phase 2, fan-out: N SSE streams (default 1,000) on `GET /api/events` through nginx;
once every stream has its `: stream open` comment, W writes (default 5, spaced by
--gap seconds) `POST /api/collections/saved_prompts` through nginx, each timed from
just before its request is sent to the moment each stream has parsed its
`data: {"collection": "saved_prompts"}` record. Per write and over all: p50/p99/max
and how many streams received it (duplicates counted apart). The target: p99 <= 1 s
for every write (the worst write's p99 is the verdict).

The clients run in this process on gevent (one greenlet per client or stream, raw
sockets, a minimal HTTP/1.1 client that reads bodies into a reused buffer), on the
same machine as nginx and the service: they compete for the CPUs, so the CPU of
each is printed, and so is what other processes and the hypervisor took meanwhile
(a segment where they took more than 15 % of one CPU is flagged DISTURBED).
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from gevent.lock import BoundedSemaphore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/wizard.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HOST,
    REQUEST_TIMEOUT_S,
    ChunkedBody,
    CpuMeter,
    HttpError,
    KeepAliveClient,
    Service,
    build_request,
    child_pids,
    exit_on_sigterm,
    fmt_ms,
    log_tails,
    machine_busy_seconds,
    merge_rounds,
    percentile,
    print_targets,
    raise_nofile,
    run_header,
    stop_nginx,
    timed_answers,
    verdict,
)
from devtools import nginx as devnginx  # noqa: E402

LIST = "/api/collections/blueprints"
EVENTS = "/api/events"
WRITE = "/api/collections/saved_prompts"
WRITE_COLLECTION = "saved_prompts"
AUTHORS = ("ada", "grace", "linus", "margaret", "ken")

# Targets (from the issue).
TARGET_ROWS = 1000
TARGET_CLIENTS = 50
TARGET_STREAMS = 1000
TARGET_P99_S = 1.0

# Bounds: every wait below has one of these.
MAX_REQUESTS = 10_000_000  # per client and segment
MAX_RECONNECTS = 20  # per client and segment
SEED_TIMEOUT_S = 180.0  # posting the rows
OPEN_TIMEOUT_S = 30.0  # one stream: connect -> ": stream open"
OPEN_PHASE_TIMEOUT_S = 180.0  # all streams
DELIVERY_TIMEOUT_S = 15.0  # one write reaching every stream
COLD_SAMPLES = 5  # list fetches right after a write


# --------------------------------------------------------------------------- helpers


def fmt_us(seconds):
    return "-" if seconds is None else f"{seconds * 1e6:.0f} us"


def fmt_kb(size):
    return f"{size / 1024:.1f} kB"


class Stack:
    """The service, and nginx in front of it (the production site; nginx serves the
    service's uploads folder itself), started together and stopped together."""

    def __init__(self, root, name, workers, nginx_connections, env=None, lists_via_nginx=True):
        """`lists_via_nginx`: the site sends the collection lists from the service's
        files (wizard_lists_dir), as production does; False: the service sends them."""
        self.data_dir = root / f"{name}-data"
        self.uploads_dir = self.data_dir / "uploads"
        self.uploads_dir.mkdir(parents=True)
        self.proxy = None
        self.service = Service("wizard", self.data_dir, root / f"{name}-service.log", workers=workers, env=env)
        lists = {"wizard_lists_dir": str(self.data_dir / "lists")} if lists_via_nginx else {}
        try:
            self.proxy = devnginx.start(
                root / f"{name}-nginx",
                None,
                {"wizard": f"{HOST}:{self.service.port}"},
                variables={
                    **lists,
                    "wizard_uploads_dir": str(self.uploads_dir),
                    # Each stream holds two of nginx's connections (client, upstream).
                    "nginx_worker_connections": nginx_connections,
                },
            )
            self.proxy_pids = [self.proxy.process.pid, *child_pids(self.proxy.process.pid)]
        except BaseException:
            self.stop()
            raise
        self.worker_pids = self.service.worker_pids
        self.host = self.proxy.host("wizard")
        # (port, Host header, identity headers) of each way in. Through nginx, nginx sets
        # Remote-User: public; straight to gunicorn, the trusted header says the same.
        self.routes = {
            "nginx": (self.proxy.port, self.host, {}),
            "direct": (self.service.port, f"{HOST}:{self.service.port}", {"Remote-User": "public"}),
        }

    def meter(self, via_nginx=True):
        return CpuMeter(self.worker_pids, self.proxy_pids if via_nginx else ())

    def describe(self):
        return (
            f"service on {HOST}:{self.service.port} (worker pids {self.worker_pids}), nginx on "
            f"{HOST}:{self.proxy.port} (pids {self.proxy_pids}), Host {self.host}"
        )

    def stop(self):
        try:
            if self.proxy is not None:
                proxy, self.proxy = self.proxy, None
                stop_nginx(proxy)
        finally:
            self.service.stop()

    def log_tails(self):
        return log_tails(self.service, self.proxy)


class BodyClient(KeepAliveClient):
    """One keep-alive connection that reads each response's body into a reused
    buffer (recv_into) and keeps only its status and length: the bench client reads
    hundreds of megabytes a second here, and must not cost more than it has to."""

    def __init__(self, port, timeout=REQUEST_TIMEOUT_S):
        super().__init__(port, timeout=timeout)
        self.scratch = memoryview(bytearray(256 * 1024))
        self.etag = None  # of the last answer

    def send(self, raw):
        """(status, body length, first bytes of the body) of one request; its ETag in
        `self.etag`."""
        if self.sock is None or time.monotonic() - self.last_used > self.MAX_IDLE_S:
            self.connect()
        sock = self.sock
        try:
            sock.sendall(raw)
            buf = b""
            while True:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                buf += data
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    break
            head = buf[:end].decode("latin-1")
            status = int(head[9:12])
            length = close = etag = None
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection":
                    close = value.strip().lower() == "close"
                elif name == "etag":
                    etag = value.strip()
            self.etag = etag
            if length is None and status in (204, 304):
                length = 0  # no body, by definition
            if length is None:
                raise HttpError(f"response without Content-Length ({head[:200]!r})")
            rest = buf[end + 4 :]
            if len(rest) > length:
                raise HttpError("more bytes than the response's length (the client never pipelines)")
            first = rest[:64]
            remaining = length - len(rest)
            scratch = self.scratch
            while remaining > 0:
                n = sock.recv_into(scratch, min(remaining, len(scratch)))
                if not n:
                    raise ConnectionError("the server closed the connection mid-body")
                remaining -= n
            if close:
                self.close()
            self.last_used = time.monotonic()
            return status, length, first
        except BaseException:
            self.close()  # the connection's state is unknown: never reuse it
            raise


# --------------------------------------------------------------------------- phase 1: list


def blueprint(i, rng):
    """One realistic blueprint payload (the server adds id, created_at, user_id, likes_count)."""
    words = (
        "storyboard",
        "moodboard",
        "portrait",
        "landscape",
        "product shot",
        "poster",
        "cinematic",
        "watercolour",
        "isometric",
        "retro",
        "noir",
        "minimal",
        "neon",
        "pastel",
        "studio light",
    )
    description = (
        f"A {rng.choice(words)} {rng.choice(words)} blueprint: step-by-step prompts for the "
        f"subject, lighting, lens and palette, tuned for consistent results across a series."
    )
    return {
        "title": f"{rng.choice(words).title()} {rng.choice(words)} #{i + 1}",
        "description": description[:150].ljust(150, "."),
        "cover_url": f"/uploads/{uuid.uuid4().hex}.webp",
        "tags": rng.sample(words, 3),
        "is_public": True,
        "wizard_id": f"wizard-{i % 12 + 1}",
        "steps": rng.randint(3, 9),
    }


def seed_rows(port, count, concurrency=8):
    """Post `count` public blueprints straight to gunicorn, as several authors."""
    rng = random.Random(2002)
    payloads = [blueprint(i, rng) for i in range(count)]
    left = list(range(count))
    left.reverse()

    def poster(index):
        client = KeepAliveClient(port)
        headers = {"Remote-User": AUTHORS[index % len(AUTHORS)]}
        try:
            while left:
                i = left.pop()
                client.json("POST", LIST, payloads[i], headers=headers, expect=(201,))
        finally:
            client.close()

    greenlets = [gevent.spawn(poster, i) for i in range(min(concurrency, count))]
    try:
        gevent.joinall(greenlets, timeout=SEED_TIMEOUT_S, raise_error=True)
        if any(not g.dead for g in greenlets):
            raise RuntimeError(f"seeding {count} rows took more than {SEED_TIMEOUT_S:g} s")
    finally:
        gevent.killall(greenlets, timeout=5)


def run_clients(port, raw, expect_size, clients, seconds, meter):
    """`clients` keep-alive clients sending `raw` back-to-back for `seconds` (each
    finishes the request in flight at the deadline). Returns {count, seconds, rate,
    latencies, statuses, errors, bad, cpu, stragglers}."""
    latencies, statuses, errors, bad = [], Counter(), Counter(), Counter()
    per_client = [0] * clients
    start = Event()
    state = {"deadline": None}

    def worker(index, client):
        start.wait()
        for status, length, first in timed_answers(
            client, lambda: client.send(raw), state["deadline"], latencies, errors, MAX_REQUESTS, MAX_RECONNECTS
        ):
            statuses[status] += 1
            per_client[index] += 1
            if (status != 200 or length != expect_size) and len(bad) < 20:
                bad[f"{status}, {length} bytes (expected {expect_size}): {first!r}"] += 1

    pool, greenlets = [], []
    try:
        for _ in range(clients):
            client = BodyClient(port)
            client.connect()
            pool.append(client)
        greenlets = [gevent.spawn(worker, i, c) for i, c in enumerate(pool)]
        gevent.sleep(0.1)  # every greenlet waits on `start`
        meter.start()
        state["deadline"] = time.perf_counter() + seconds
        start.set()
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
        "per_client": per_client,
    }


def merge(segments):
    """One route's segments (rounds) as one figure, with how evenly clients were served."""
    figure = merge_rounds(segments)
    per_second = [n / s["seconds"] for s in segments for n in s["per_client"]] if figure["seconds"] else [0.0]
    # Fairness: answers per client per second, the least and the most served client.
    figure.update(client_min=min(per_second), client_max=max(per_second), disturbed=figure["disturbed_rounds"])
    return figure


def cold_list(stack, rows):
    """The list's cost without the cache: fetched alone right after a write (a PATCH
    of a row with its own title: the version rises, the answer keeps its size),
    against the same fetch served from the cache just after."""
    port, host, headers = stack.routes["direct"]
    api = KeepAliveClient(port)
    author = KeepAliveClient(port)
    raw = build_request("GET", LIST, host, headers)
    fresh, cached, sizes = [], [], set()
    try:
        for i in range(COLD_SAMPLES):
            row = rows[i % len(rows)]
            author.json(
                "PATCH",
                f"{LIST}/{row['id']}",
                {"title": row["title"]},
                headers={"Remote-User": row["user_id"]},
                expect=(200,),
            )
            for into in (fresh, cached):
                t0 = time.perf_counter()
                status, _, body = api.send(raw)
                into.append(time.perf_counter() - t0)
                if status != 200:
                    raise HttpError(f"GET {LIST} -> {status}: {body[:200]!r}")
                sizes.add(len(body))
    finally:
        api.close()
        author.close()
    return {
        "fresh_p50": percentile(fresh, 50),
        "fresh_max": max(fresh),
        "cached_p50": percentile(cached, 50),
        "cached_max": max(cached),
        "sizes": sizes,
    }


def run_list(args, root):
    print(
        f"\n== List: {args.rows} public blueprints, {args.clients} keep-alive clients, {args.rounds} rounds x "
        f"{args.seconds:g} s per route, {args.workers} gevent worker(s) ==",
        flush=True,
    )
    stack = Stack(root, "list", args.workers, max(1024, 4 * args.clients + 256))
    try:
        print(f"   {stack.describe()}", flush=True)
        t = time.perf_counter()
        seed_rows(stack.service.port, args.rows)
        print(f"   posted {args.rows} blueprints straight to gunicorn in {time.perf_counter() - t:.1f} s", flush=True)

        # The list as nginx's visitors (public) get it, and the same straight from gunicorn.
        probe = KeepAliveClient(stack.proxy.port, stack.host)
        direct = KeepAliveClient(stack.service.port)
        try:
            status, headers, body = probe.request("GET", LIST)
            if status != 200:
                raise HttpError(f"GET {LIST} through nginx -> {status}: {body[:300]!r}")
            rows = json.loads(body)
            status_d, _, body_d = direct.request("GET", LIST, headers=stack.routes["direct"][2])
        finally:
            probe.close()
            direct.close()
        if len(rows) != args.rows:
            raise RuntimeError(f"the list through nginx has {len(rows)} rows, expected {args.rows}")
        if status_d != 200 or body_d != body:
            raise RuntimeError(
                f"the list straight from gunicorn differs ({status_d}, {len(body_d)} bytes) from the "
                f"one through nginx ({len(body)} bytes)"
            )
        size = len(body)
        print(
            f"   the list: {len(rows)} rows, {size} bytes ({size / len(rows):.0f} bytes per row), "
            f"Content-Type {headers.get('content-type')}, Cache-Control {headers.get('cache-control')}",
            flush=True,
        )

        # A file of exactly that size, which nginx serves from the uploads folder by itself.
        name = f"{uuid.uuid4().hex}.webp"
        (stack.uploads_dir / name).write_bytes(os.urandom(size))
        static = f"/uploads/{name}"
        probe = KeepAliveClient(stack.proxy.port, stack.host)
        try:
            status, headers, content = probe.request("GET", static)
        finally:
            probe.close()
        if status != 200 or len(content) != size:
            raise HttpError(f"GET {static} through nginx -> {status}, {len(content)} bytes (expected {size})")
        print(
            f"   static file {static}: {size} bytes through nginx (Content-Type {headers.get('content-type')}, "
            f"served from {stack.uploads_dir} by nginx itself)",
            flush=True,
        )

        routes = {  # label -> (port, raw request, via nginx)
            "list via nginx": (stack.proxy.port, build_request("GET", LIST, stack.host), True),
            "static via nginx": (stack.proxy.port, build_request("GET", static, stack.host), True),
            "list direct": (
                stack.service.port,
                build_request("GET", LIST, stack.routes["direct"][1], stack.routes["direct"][2]),
                False,
            ),
        }
        # Warm-up (not counted): connection pools, nginx's upstream keepalive, the list's cache entry.
        for port, raw, via in routes.values():
            run_clients(port, raw, size, args.clients, min(1.0, args.seconds), stack.meter(via))
        segments = {label: [] for label in routes}
        order = list(routes)
        for r in range(args.rounds):
            for label in order if r % 2 == 0 else order[::-1]:
                port, raw, via = routes[label]
                segment = run_clients(port, raw, size, args.clients, args.seconds, stack.meter(via))
                segments[label].append(segment)
                cpu = segment["cpu"]
                print(
                    f"   round {r + 1} {label:<17} {segment['rate']:7.0f} req/s  "
                    f"p50 {fmt_ms(percentile(segment['latencies'], 50))}  "
                    f"p99 {fmt_ms(percentile(segment['latencies'], 99))}  answers {dict(segment['statuses'])}"
                    + (f"  errors {sum(segment['errors'].values())}" if segment["errors"] else "")
                    + f"  [worker {cpu.pct(cpu.worker)}, nginx {cpu.pct(cpu.proxy)}, client "
                    f"{cpu.pct(cpu.client)}, other {cpu.pct(cpu.other)}, steal {cpu.pct(cpu.steal)}]"
                    + ("  DISTURBED" if cpu.disturbed() else ""),
                    flush=True,
                )
        merged = {label: merge(s) for label, s in segments.items()}
        lst, sta = merged["list via nginx"], merged["static via nginx"]
        ratio = lst["rate"] / sta["rate"] if sta["rate"] else None
        round_ratios = [
            a["rate"] / b["rate"] for a, b in zip(segments["list via nginx"], segments["static via nginx"]) if b["rate"]
        ]
        cold = cold_list(stack, rows)
        return {
            "size": size,
            "rows": len(rows),
            "routes": merged,
            "ratio": ratio,
            "round_ratios": round_ratios,
            "cold": cold,
        }
    except BaseException:
        print(stack.log_tails(), file=sys.stderr)
        raise
    finally:
        stack.stop()


def print_route(label, r):
    print(
        f"   {label:<18} {r['rate']:7.0f} req/s (rounds "
        + ", ".join(f"{x:.0f}" for x in r["rates"])
        + f"), p50 {fmt_ms(r['p50'])}, mean {fmt_ms(r['mean'])}, p99 {fmt_ms(r['p99'])}, max {fmt_ms(r['max'])}; "
        f"{r['count']} answers {dict(r['statuses'])}"
        + (f", transport errors {sum(r['errors'].values())}" if r["errors"] else "")
        + (f", clients still running at the bound {r['stragglers']}" if r["stragglers"] else "")
        + (f"; DISTURBED in round(s) {r['disturbed']}" if r["disturbed"] else "")
    )
    print(
        f"   {'':<18} answers per client and second: least served {r['client_min']:.1f}, most served "
        f"{r['client_max']:.1f} (fairness of the scheduling)"
    )
    print(
        f"   {'':<18} CPU per request: worker {fmt_us(r['worker_per_req'])}"
        + (f", nginx {fmt_us(r['proxy_per_req'])}" if r["proxy_share"] else "")
        + f", bench client {fmt_us(r['client_per_req'])}; share of one CPU: worker {r['worker_share'] * 100:.0f}%"
        + (f", nginx {r['proxy_share'] * 100:.0f}%" if r["proxy_share"] else "")
        + f", client {r['client_share'] * 100:.0f}%, other {r['other_share'] * 100:.0f}%, "
        f"steal {r['steal_share'] * 100:.0f}%"
    )
    for what, count in (r["bad"] + r["errors"]).most_common(5):
        print(f"     {count} x {what}")


def print_list(result, args, ncpu):
    print(
        f"\n-- List results ({result['rows']} rows, {result['size']} bytes per answer; {args.clients} clients; "
        f"client, nginx and service share this {ncpu}-CPU machine) --"
    )
    print(
        "   steady state: the collection does not change while measured, so every list request is served from "
        "the service's cache of the list's JSON text (app/wizard/cache.py)"
    )
    for label, r in result["routes"].items():
        print_route(label, r)
    if result["ratio"] is not None:
        print(
            f"   {'ratio list/static':<18} {result['ratio']:.2f} through nginx (per round: "
            + ", ".join(f"{x:.2f}" for x in result["round_ratios"])
            + ")"
        )
    cold = result["cold"]
    print(
        f"   {'list not cached':<18} built after a write, fetched alone straight from gunicorn: p50 "
        f"{fmt_ms(cold['fresh_p50'])}, max {fmt_ms(cold['fresh_max'])}; the next fetch, from the cache: p50 "
        f"{fmt_ms(cold['cached_p50'])}, max {fmt_ms(cold['cached_max'])} ({COLD_SAMPLES} samples)"
    )


# --------------------------------------------------------------------------- phase 2: fan-out


class StreamClient:
    """One SSE stream on a raw socket. Through nginx (sse.conf: chunked_transfer_encoding
    off) the body is the raw event stream; straight from gunicorn it is chunked: both
    are decoded. Each `data:` record is handed to the bench."""

    __slots__ = (
        "fan",
        "sock",
        "chunks",
        "body",
        "rec_data",
        "opened",
        "last_write",
        "received",
        "duplicates",
        "others",
        "error",
        "ended",
    )

    def __init__(self, fan):
        self.fan = fan
        self.sock = None
        self.chunks = None  # a ChunkedBody when the answer is chunked
        self.body = b""
        self.rec_data = []
        self.opened = self.ended = False
        self.last_write = -1
        self.received = self.duplicates = self.others = 0
        self.error = None

    def run(self):
        fan = self.fan
        try:
            with fan.open_slots:
                started = time.perf_counter()
                with gevent.Timeout(OPEN_TIMEOUT_S, TimeoutError("open timed out")):
                    self._open()
                fan.open_times.append(time.perf_counter() - started)
            fan.stream_opened(self)
            self.sock.settimeout(None)
            while not self.ended:
                data = self.sock.recv(65536)
                if not data:
                    break
                self._feed(data)
        except gevent.GreenletExit:
            pass
        except Exception as exc:  # counted and reported, never fatal for the bench
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            fan.stream_ended(self)
            if self.sock is not None:
                self.sock.close()

    def _open(self):
        fan = self.fan
        self.sock = socket.create_connection((HOST, fan.port), timeout=OPEN_TIMEOUT_S)
        self.sock.sendall(fan.request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before the response headers")
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        if status_line.split(" ")[1] != "200":
            raise HttpError(f"stream answered {status_line!r}: {rest[:200]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        if not headers.get("content-type", "").startswith("text/event-stream"):
            raise HttpError(f"stream has Content-Type {headers.get('content-type')!r}")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self.chunks = ChunkedBody()
        self._feed(rest)
        while not self.opened and not self.ended:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before ': stream open'")
            self._feed(data)

    def _feed(self, data):
        if self.chunks is None:
            self._lines(data)
            return
        body = self.chunks.feed(data)
        self.ended = self.ended or self.chunks.ended
        if body:
            self._lines(body)

    def _lines(self, data):
        self.body += data
        *lines, self.body = self.body.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line:
                if self.rec_data:
                    self._dispatch()
                self.rec_data = []
            elif line.startswith(b":"):
                if line[1:].strip() == b"stream open":
                    self.opened = True
            else:
                name, _, value = line.partition(b":")
                if name == b"data":
                    self.rec_data.append(value[1:] if value.startswith(b" ") else value)

    def _dispatch(self):
        now = time.perf_counter()
        event = json.loads(b"\n".join(self.rec_data))
        fan = self.fan
        if event.get("collection") != WRITE_COLLECTION or fan.current is None:
            self.others += 1
            return
        if self.last_write == fan.current:
            self.duplicates += 1
            return
        self.last_write = fan.current
        self.received += 1
        fan.arrived(now)


class FanOut:
    def __init__(self, port, host, open_concurrency):
        self.port = port
        self.request = (
            f"GET {EVENTS} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
        ).encode("latin-1")
        self.open_slots = BoundedSemaphore(open_concurrency)
        self.open_times = []
        self.streams, self.greenlets = [], []
        self.live = self.opened_count = self.failed = self.target_open = 0
        self.all_opened = Event()
        self.current = None  # index of the write being timed
        self.arrivals = []  # perf_counter of each stream's receipt of the current write
        self.expected = 0
        self.done = Event()

    def stream_opened(self, stream):
        self.live += 1
        self.opened_count += 1
        self._check_all_opened()

    def stream_ended(self, stream):
        if stream.opened:
            self.live -= 1
        else:
            self.failed += 1
            self._check_all_opened()

    def _check_all_opened(self):
        if self.opened_count + self.failed >= self.target_open:
            self.all_opened.set()

    def open(self, count):
        self.target_open = count
        for _ in range(count):
            stream = StreamClient(self)
            self.streams.append(stream)
            self.greenlets.append(gevent.spawn(stream.run))
        self.all_opened.wait(OPEN_PHASE_TIMEOUT_S)

    def expect(self, index):
        """Before write `index` is sent: every live stream is to receive it."""
        self.current, self.arrivals, self.expected = index, [], self.live
        self.done = Event()
        if self.expected == 0:
            self.done.set()

    def arrived(self, now):
        self.arrivals.append(now)
        if len(self.arrivals) >= self.expected:
            self.done.set()

    def close(self):
        gevent.killall(self.greenlets, timeout=10)

    def errors(self):
        return Counter(s.error for s in self.streams if s.error)


def run_fanout(args, root, env=None):
    """`env`: more environment for the service (bench.scale gives REDIS_URL)."""
    print(
        f"\n== Fan-out: {args.streams} SSE streams on {EVENTS} through nginx, {args.writes} writes "
        f"(POST {WRITE} through nginx, {args.gap:g} s apart), {args.workers} gevent worker(s) ==",
        flush=True,
    )
    stack = Stack(root, f"fanout-{args.workers}w", args.workers, max(1024, 2 * args.streams + 512), env=env)
    fan = warm = None
    api = KeepAliveClient(stack.proxy.port, stack.host)
    try:
        print(f"   {stack.describe()}", flush=True)

        def write(i):
            return api.json(
                "POST",
                WRITE,
                {
                    "text": f"fan-out probe {i}: a saved prompt of a realistic length, lorem ipsum dolor sit amet " * 2,
                    "title": f"probe {i}",
                    "tags": ["bench"],
                },
                expect=(201,),
            )

        # Warm-up: a few streams opened, fed one write and closed (first-request costs, the watcher).
        warm = FanOut(stack.proxy.port, stack.host, 5)
        warm.open(5)
        warm.expect(0)
        write("warm-up")
        warm.done.wait(DELIVERY_TIMEOUT_S)
        warm_got = len(warm.arrivals)
        warm.close()
        warm = None
        if warm_got < 5:
            print(f"   warning: the warm-up write reached {warm_got}/5 streams", flush=True)

        fan = FanOut(stack.proxy.port, stack.host, args.open_concurrency)
        meter = stack.meter().start()
        fan.open(args.streams)
        meter.stop()
        open_cpu = meter
        print(
            f"   opened {fan.opened_count}/{args.streams} streams in {open_cpu.seconds:.1f} s "
            f"(failed: {fan.failed}); time to ': stream open' p50 {fmt_ms(percentile(fan.open_times, 50))}, p99 "
            f"{fmt_ms(percentile(fan.open_times, 99))}; CPU: worker {open_cpu.worker:.2f} s, nginx "
            f"{open_cpu.proxy:.2f} s, client {open_cpu.client:.2f} s",
            flush=True,
        )
        for error, count in fan.errors().most_common(5):
            print(f"     {count} x {error}")

        per_write, latencies, posts = [], [], []
        meter = stack.meter().start()
        for i in range(args.writes):
            if fan.live == 0:
                break
            fan.expect(i)
            t0 = time.perf_counter()
            write(i + 1)
            posts.append(time.perf_counter() - t0)
            fan.done.wait(DELIVERY_TIMEOUT_S)
            got = [t - t0 for t in fan.arrivals]
            latencies.extend(got)
            w = {
                "index": i + 1,
                "received": len(got),
                "expected": fan.expected,
                "p50": percentile(got, 50),
                "p99": percentile(got, 99),
                "max": max(got) if got else None,
                "post": posts[-1],
            }
            per_write.append(w)
            print(
                f"   write {i + 1}: {w['received']}/{w['expected']} streams, p50 {fmt_ms(w['p50'])}, p99 "
                f"{fmt_ms(w['p99'])}, max {fmt_ms(w['max'])}; POST -> 201 {fmt_ms(w['post'])}",
                flush=True,
            )
            if i + 1 < args.writes:
                gevent.sleep(args.gap)  # spacing between writes (the target is about one write at a time)
        fan.current = None
        meter.stop()
        result = {
            "streams_wanted": args.streams,
            "opened": fan.opened_count,
            "failed": fan.failed,
            "open_seconds": open_cpu.seconds,
            "open_p50": percentile(fan.open_times, 50),
            "open_p99": percentile(fan.open_times, 99),
            "open_cpu": open_cpu,
            "writes": per_write,
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
            "worst_p99": max((w["p99"] for w in per_write if w["p99"] is not None), default=None),
            "received": sum(w["received"] for w in per_write),
            "expected": sum(w["expected"] for w in per_write),
            "duplicates": sum(s.duplicates for s in fan.streams),
            "others": sum(s.others for s in fan.streams),
            "ended_early": sum(1 for s in fan.streams if s.opened and (s.ended or s.error)),
            "stream_errors": fan.errors(),
            "cpu": meter,
            "live_at_end": fan.live,
        }
        return result
    except BaseException:
        print(stack.log_tails(), file=sys.stderr)
        raise
    finally:
        api.close()
        for f in (warm, fan):
            if f is not None:
                f.close()
        stack.stop()


def print_fanout(r, args, ncpu):
    print(f"\n-- Fan-out results (client, nginx and service share this {ncpu}-CPU machine) --")
    print(
        f"   streams opened:       {r['opened']}/{r['streams_wanted']} (failed {r['failed']}) in "
        f"{r['open_seconds']:.1f} s; time to ': stream open' p50 {fmt_ms(r['open_p50'])}, "
        f"p99 {fmt_ms(r['open_p99'])}"
    )
    print(f"   writes:               {len(r['writes'])} ({args.gap:g} s apart)")
    print(
        f"   deliveries:           {r['received']}/{r['expected']} (duplicates {r['duplicates']}, records of "
        f"other collections {r['others']}; streams that ended or failed after opening {r['ended_early']})"
    )
    print(
        f"   POST -> receipt:      p50 {fmt_ms(r['p50'])}, p99 {fmt_ms(r['p99'])}, max {fmt_ms(r['max'])} over all "
        f"writes; worst single-write p99 {fmt_ms(r['worst_p99'])}"
    )
    cpu = r["cpu"]
    n = max(1, len(r["writes"]))
    print(
        f"   CPU per write:        worker {cpu.worker / n * 1000:.0f} ms, nginx {cpu.proxy / n * 1000:.0f} ms, "
        f"bench client {cpu.client / n * 1000:.0f} ms (the {args.gap:g} s gaps included); other processes "
        f"{cpu.pct(cpu.other)} of one CPU, steal {cpu.pct(cpu.steal)}" + ("  DISTURBED" if cpu.disturbed() else "")
    )
    for error, count in r["stream_errors"].most_common(5):
        print(f"     {count} x {error}")


# --------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.wizard",
        description="Prompt wizard benchmark: the 1,000-row blueprint list vs a static file of the same size "
        "through nginx, and one write's fan-out to 1,000 /api/events streams. Prints figures; "
        "asserts nothing.",
    )
    p.add_argument("--rows", type=int, default=TARGET_ROWS, help=f"blueprints in the list (default {TARGET_ROWS})")
    p.add_argument(
        "--clients",
        type=int,
        default=TARGET_CLIENTS,
        help=f"concurrent keep-alive clients in phase 1 (default {TARGET_CLIENTS})",
    )
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per route and round in phase 1 (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the routes in phase 1, ABBA (default 3)")
    p.add_argument(
        "--streams", type=int, default=TARGET_STREAMS, help=f"SSE streams in phase 2 (default {TARGET_STREAMS})"
    )
    p.add_argument("--writes", type=int, default=5, help="timed writes in phase 2 (default 5)")
    p.add_argument("--gap", type=float, default=1.0, help="seconds between two writes (default 1)")
    p.add_argument("--open-concurrency", type=int, default=100, help="streams being opened at once (default 100)")
    p.add_argument("--workers", type=int, default=1, help="gunicorn workers (default 1)")
    p.add_argument("--only", choices=("list", "fanout"), help="run one phase only")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 2 rounds of 1.5 s per route, 200 streams, 3 writes 0.5 s apart"
    )
    p.add_argument("--tmp-dir", help="parent of the temporary DATA_DIRs (default: the system's, /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (data, logs, nginx prefix)")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.streams, args.writes, args.gap = 1.5, 2, 200, 3, 0.5
    for name in ("rows", "clients", "rounds", "streams", "writes", "workers", "open_concurrency"):
        if not 1 <= getattr(args, name) <= 100_000:
            p.error(f"--{name.replace('_', '-')} must be between 1 and 100000")
    if not 0 < args.seconds <= 600 or not 0 <= args.gap <= 60:
        p.error("--seconds must be in (0, 600], --gap in [0, 60]")
    return args


def main(argv=None):
    args = parse_args(argv)

    exit_on_sigterm()
    try:
        devnginx.nginx_binary()
    except devnginx.NginxError as exc:
        sys.exit(str(exc))
    ncpu = os.cpu_count()
    soft, hard = raise_nofile()  # before nginx starts: its workers inherit the limit
    needed = args.streams * 3 + 4 * args.clients + 200  # this client's streams, nginx's two sides
    if soft < needed:
        print(f"warning: RLIMIT_NOFILE is {soft}; capping --streams to {max(1, (soft - 4 * args.clients - 200) // 3)}")
        args.streams = max(1, (soft - 4 * args.clients - 200) // 3)
    root = Path(tempfile.mkdtemp(prefix="bench-wizard-", dir=args.tmp_dir))
    nginx_version = subprocess.run(
        [devnginx.nginx_binary(), "-v"], capture_output=True, text=True, timeout=10
    ).stderr.strip()
    print(f"{run_header('prompt wizard benchmark', args.quick)}, {nginx_version}")
    print(
        f"temporary DATA_DIRs and nginx prefixes under {root}; bench client: gevent, raw sockets, "
        f"RLIMIT_NOFILE {soft}/{hard}; it runs on the same {ncpu} CPUs as nginx and the service"
    )
    lst = fan = None
    steal0, t_run = machine_busy_seconds()[1], time.perf_counter()
    try:
        if args.only in (None, "list"):
            lst = run_list(args, root)
            print_list(lst, args, ncpu)
        if args.only in (None, "fanout"):
            fan = run_fanout(args, root)
            print_fanout(fan, args, ncpu)
    finally:
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    steal, t_run = machine_busy_seconds()[1] - steal0, time.perf_counter() - t_run
    print(f"\n== Summary ({'quick smoke run: fewer streams than the target' if args.quick else 'full run'}) ==")
    print(
        f"   CPU stolen by the hypervisor over the whole run: {steal:.2f} s in {t_run:.0f} s "
        f"({steal / t_run * 100 / ncpu:.1f}% of the {ncpu} CPUs)"
    )
    rows, verdicts = [], []
    if lst:
        r, s, d = (lst["routes"][k] for k in ("list via nginx", "static via nginx", "list direct"))
        disturbed = r["disturbed"] or s["disturbed"]
        all_ok = r["all_ok"] and s["all_ok"]
        rows.append(
            (
                f"list / static req/s via nginx ({lst['rows']} rows, {fmt_kb(lst['size'])})",
                f"{r['rate']:.0f} / {s['rate']:.0f} = {lst['ratio'] or 0:.2f}; p99 {fmt_ms(r['p99'])} / "
                f"{fmt_ms(s['p99'])}; all 200: {'yes' if all_ok else 'NO'}"
                + ("; DISTURBED by other processes" if disturbed else ""),
                "ratio (figure)",
                None,
            )
        )
        rows.append(
            (
                "list req/s straight to gunicorn",
                f"{d['rate']:.0f}; p99 {fmt_ms(d['p99'])}; all 200: "
                f"{'yes' if d['all_ok'] else 'NO'}" + ("; DISTURBED" if d["disturbed"] else ""),
                "(figure)",
                None,
            )
        )
        verdicts.append(
            f"TARGET 1 GET {LIST} ({lst['rows']} rows, {args.clients} clients, {args.workers} worker(s)) "
            f"through nginx: {r['rate']:.0f} req/s, {lst['ratio'] or 0:.2f} x nginx serving a static "
            f"file of the same size ({s['rate']:.0f} req/s); a figure, no threshold"
            + (" (DISTURBED run)" if disturbed else "")
        )
    if fan:
        complete = fan["expected"] > 0 and fan["received"] == fan["expected"]
        held = fan["opened"] >= TARGET_STREAMS and fan["failed"] == 0
        ok = fan["worst_p99"] is not None and fan["worst_p99"] <= TARGET_P99_S and complete and held
        disturbed = fan["cpu"].disturbed()
        rows.append(
            (
                f"fan-out to {fan['opened']} streams, worst write p99",
                f"{fmt_ms(fan['worst_p99'])} (all writes: p99 {fmt_ms(fan['p99'])}, max {fmt_ms(fan['max'])}; "
                f"{fan['received']}/{fan['expected']} delivered)" + ("; DISTURBED" if disturbed else ""),
                f"<= {TARGET_P99_S:.0f} s, {TARGET_STREAMS} streams, all delivered",
                ok,
            )
        )
        verdicts.append(
            f"TARGET 2 one write reaching {TARGET_STREAMS} open {EVENTS} streams through nginx, p99 <= "
            f"{TARGET_P99_S:.0f} s: {verdict(ok)} (worst write p99 {fmt_ms(fan['worst_p99'])}, "
            f"{fan['opened']} streams)"
            + (" (quick run: stream count below the target)" if args.quick and not held else "")
        )
    print_targets(rows)
    for line in verdicts:
        print(line)
    if args.quick:
        print("(quick smoke run: short segments, noisier figures)")


if __name__ == "__main__":
    main()
