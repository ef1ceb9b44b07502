"""Deck review service benchmark: SSE fan-out and durable appends. Run by hand:

    .venv/bin/python -m bench.decks            # full run (2,000 streams with 1 then 2 workers, 10 s of appends)
    .venv/bin/python -m bench.decks --quick    # smoke run (200 streams, 3 s of appends)
    .venv/bin/python bench/decks.py --help

It starts the deck service itself with devtools.services.start (gunicorn, gevent
worker, exactly as production), each phase on a fresh temporary DATA_DIR, talks to
127.0.0.1 only, prints figures and a verdict per target, and stops the service
whatever happens. It asserts nothing and is never collected as a test.

Phase 1, fan-out, once per --fanout-workers count (default 1 then 2, in the same
run, so that the 2-worker figures stand beside their 1-worker reference): N
concurrent SSE streams on one session, spread evenly over the workers (each
stream's worker is told apart through /proc, surplus streams are closed and others
opened until each worker holds its share). E events are posted one at a time, each
on a fresh connection to the workers in turn (made before its clock starts), and
timed from just before its POST is sent to the moment each stream client has parsed
that record: per receipt, and per event to its last receipt. With several workers,
receipts on the worker that took the POST (published at once) and on the others
(heard through inotify on the log) are shown apart. Worker RSS (VmRSS, summed over
the workers) is read before the streams open and after.

Phase 2, durable appends (--workers gunicorn workers, default 1): P concurrent
posters on keep-alive connections post notes for --seconds; every answer must be
a 201, and the log must then hold exactly the acknowledged events with seqs 1..N.
Beside it, the raw rate of "append one ~150-byte line + fdatasync" on the same
disk (a file in the same DATA_DIR), measured in the same run.

The clients run in this process on gevent (one greenlet per stream or poster, raw
sockets with a minimal HTTP/1.1 client), on the same machine as the service: they
compete with it for the CPUs, which the report says.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
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
if str(ROOT) not in sys.path:  # run as `python bench/decks.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HOST,
    REQUEST_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ChunkedBody,
    CpuMeter,
    HttpError,
    KeepAliveClient,
    Service,
    exit_on_sigterm,
    fmt_ms,
    machine_busy_seconds,
    percentile,
    print_targets,
    proc_cpu_seconds,
    proc_status_kb,
    raise_nofile,
    run_header,
    self_cpu_seconds,
    timed_answers,
    verdict,
)
from devtools.worker_sockets import connection_workers  # noqa: E402

SAMPLE_DECK = ROOT / "samples" / "decks" / "welcome"

# Targets (from the issue).
TARGET_STREAMS = 2000
TARGET_P99_S = 1.0
TARGET_KB_PER_STREAM = 100.0
TARGET_APPENDS_PER_S = 800.0
TARGET_SEVERAL_WORKERS_DELTA_S = 0.050  # issue #16: 2-worker fan-out p99 within 50 ms of 1 worker's

# Bounds: every wait below has one of these.
OPEN_TIMEOUT_S = 30.0  # one stream: connect → ": stream open"
OPEN_PHASE_TIMEOUT_S = 180.0  # all streams
EVENT_TIMEOUT_S = 15.0  # one fan-out event reaching every stream


# --------------------------------------------------------------------------- helpers


def filesystem_of(path):
    """(device, mount point, fs type) holding `path`."""
    path = os.path.realpath(path)
    best = ("?", "/", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[1]):
                    best = (device, mount, fstype)
    except OSError:
        pass
    return best


def copy_sample_deck(data_dir, name="welcome"):
    """The sample deck's sources under DATA_DIR/sources/<name>; returns the import body
    (as tests/support/decks.py does)."""
    shutil.copytree(SAMPLE_DECK, Path(data_dir) / "sources" / name)
    return {"id": name, "md_path": f"sources/{name}/deck.md", "copy_from": f"sources/{name}"}


def client_on(port, pid, pids, attempts=200):
    """A fresh keep-alive client whose connection worker `pid` has accepted (with
    one worker, any fresh connection)."""
    for _ in range(attempts):
        client = KeepAliveClient(port)
        client.connect()
        if len(pids) == 1:
            return client
        client_port = client.sock.getsockname()[1]
        deadline = time.monotonic() + OPEN_TIMEOUT_S
        owner = None
        while owner is None and time.monotonic() < deadline:
            owner = connection_workers(port, pids).get(client_port)
            if owner is None:
                gevent.sleep(0.002)  # until a worker has accepted it (bounded)
        if owner == pid:
            return client
        client.close()
    raise RuntimeError(f"worker {pid} accepted none of {attempts} connections")


# --------------------------------------------------------------------------- fan-out


class StreamClient:
    """One SSE stream on a raw socket: HTTP/1.1 chunked transfer decoding, then
    `id:` / `data:` lines. Each complete record is handed to `on_record`."""

    __slots__ = (
        "index",
        "bench",
        "sock",
        "chunks",
        "body",
        "rec_id",
        "rec_data",
        "opened",
        "last_seq",
        "received",
        "duplicates",
        "gaps",
        "closed_reason",
        "error",
        "ended",
        "worker",
        "greenlet",
    )

    def __init__(self, index, bench):
        self.index, self.bench = index, bench
        self.sock = None
        self.chunks, self.body = ChunkedBody(), b""
        self.rec_id, self.rec_data = None, []
        self.opened = False
        self.last_seq = bench.after
        self.received = self.duplicates = self.gaps = 0
        self.closed_reason = self.error = None
        self.ended = False
        self.worker = None  # the pid of the worker serving it, once known
        self.greenlet = None

    def run(self):
        bench = self.bench
        try:
            with bench.open_slots:
                started = time.perf_counter()
                try:
                    with gevent.Timeout(OPEN_TIMEOUT_S, TimeoutError("open timed out")):
                        self._open()
                finally:
                    if self.opened:
                        bench.open_times.append(time.perf_counter() - started)
            bench.stream_opened(self)
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
            bench.stream_ended(self)
            if self.sock is not None:
                self.sock.close()

    def _open(self):
        bench = self.bench
        self.sock = socket.create_connection((HOST, bench.port), timeout=OPEN_TIMEOUT_S)
        self.sock.sendall(
            (
                f"GET {bench.stream_path} HTTP/1.1\r\nHost: {HOST}:{bench.port}\r\nAccept: text/event-stream\r\n\r\n"
            ).encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before the response headers")
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        if status_line.split(" ")[1] != "200":
            raise HttpError(f"stream answered {status_line!r}")
        if not any(h.lower().replace(" ", "") == "transfer-encoding:chunked" for h in header_lines):
            raise HttpError(f"stream is not chunked: {header_lines}")
        self._feed(rest)
        while not self.opened and not self.ended:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before ': stream open'")
            self._feed(data)

    def _feed(self, data):
        """Decode HTTP chunked framing, then split the body into SSE lines."""
        body = self.chunks.feed(data)
        self.ended = self.ended or self.chunks.ended
        if body:
            self.body += body
            *lines, self.body = self.body.split(b"\n")
            for line in lines:
                self._line(line.rstrip(b"\r"))

    def _line(self, line):
        if not line:
            if self.rec_data:
                self._dispatch()
            self.rec_id, self.rec_data = None, []
        elif line.startswith(b":"):
            text = line[1:].strip().decode("utf-8", "replace")
            if text == "stream open":
                self.opened = True
            elif text.startswith("closed"):
                self.closed_reason = text
        else:
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"id":
                self.rec_id = value
            elif name == b"data":
                self.rec_data.append(value)

    def _dispatch(self):
        now = time.perf_counter()
        event = json.loads(b"\n".join(self.rec_data))
        seq = event["seq"]
        if self.rec_id is None or int(self.rec_id) != seq:
            self.bench.id_mismatches += 1
        if seq <= self.last_seq:
            self.duplicates += 1
            return
        if seq != self.last_seq + 1:
            self.gaps += 1
        self.last_seq = seq
        self.received += 1
        self.bench.record(seq, now, self.worker)


class FanOut:
    def __init__(self, port, session_id, after, open_concurrency):
        self.port = port
        self.after = after
        self.stream_path = f"/api/sessions/{session_id}/stream?after={after}"
        self.open_slots = BoundedSemaphore(open_concurrency)
        self.open_times = []
        self.streams = []
        self.greenlets = []
        self.live = 0
        self.all_opened = Event()
        self.target_open = 0
        self.opened_count = 0
        self.failed = 0
        self.dropped = 0  # closed by the bench to even the streams out over the workers
        self.arrivals = {}  # seq -> [(perf_counter of a stream's receipt, that stream's worker)]
        self.expected = {}  # seq -> number of streams live when it was posted
        self.done = {}  # seq -> Event set when every expected stream has it
        self.id_mismatches = 0

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
        self.target_open = self.opened_count + self.failed + count
        self.all_opened.clear()
        for _ in range(count):
            stream = StreamClient(len(self.streams), self)
            self.streams.append(stream)
            stream.greenlet = gevent.spawn(stream.run)
            self.greenlets.append(stream.greenlet)
        self.all_opened.wait(OPEN_PHASE_TIMEOUT_S)

    def live_streams(self):
        return [s for s in self.streams if s.opened and not s.ended and not s.greenlet.dead]

    def spread(self, pids, wanted, rounds=20):
        """Even the live streams out over the workers `pids`, `wanted` in all: learn
        each stream's worker (/proc), close what a worker holds beyond its share, and
        open more while one lacks its share (bounded rounds). {pid: its streams}."""
        share = {pid: wanted // len(pids) + (1 if i < wanted % len(pids) else 0) for i, pid in enumerate(pids)}
        by_worker = {}
        for _ in range(rounds):
            owners = connection_workers(self.port, pids) if len(pids) > 1 else None
            by_worker, surplus = {pid: [] for pid in pids}, []
            for stream in self.live_streams():
                stream.worker = pids[0] if owners is None else owners.get(stream.sock.getsockname()[1])
                held = by_worker.get(stream.worker)
                (held if held is not None and len(held) < share[stream.worker] else surplus).append(stream)
            if surplus:
                gevent.killall([stream.greenlet for stream in surplus], timeout=10)
                self.dropped += len(surplus)
            missing = sum(share[pid] - len(streams) for pid, streams in by_worker.items())
            if not missing:
                break
            self.open(missing * len(pids) + 10)  # they spread as the kernel hands them out
        return by_worker

    def record(self, seq, now, worker):
        times = self.arrivals.setdefault(seq, [])
        times.append((now, worker))
        expected = self.expected.get(seq)
        if expected is not None and len(times) >= expected:
            self.done[seq].set()

    def expect(self, seq):
        self.expected[seq] = self.live
        self.done[seq] = Event()
        if len(self.arrivals.get(seq, ())) >= self.live:
            self.done[seq].set()

    def close(self):
        gevent.killall(self.greenlets, timeout=10)

    def errors(self):
        return Counter(s.error for s in self.streams if s.error)


def post_many(port, path, count, concurrency=20):
    """Post `count` notes with `concurrency` keep-alive posters (to pre-fill a log)."""
    left = [count]

    def poster(index):
        client = KeepAliveClient(port)
        try:
            while left[0] > 0:
                left[0] -= 1
                client.json(
                    "POST",
                    path,
                    {"type": "note", "slide": 0, "text": f"pre-fill from poster {index}: " + "lorem ipsum " * 5},
                    expect=(201,),
                )
        finally:
            client.close()

    greenlets = [gevent.spawn(poster, i) for i in range(min(concurrency, count))]
    gevent.joinall(greenlets, timeout=max(60.0, count / 50.0), raise_error=True)
    gevent.killall(greenlets, timeout=5)


def sum_kb(pids, field):
    values = [proc_status_kb(pid, field) for pid in pids]
    return None if None in values else sum(values)


def run_fanout(args, root, workers=1):
    data_dir = root / f"fanout-{workers}w-data"
    data_dir.mkdir()
    import_body = copy_sample_deck(data_dir)
    result = {"streams_wanted": args.streams, "events_wanted": args.events, "prefill": args.prefill, "workers": workers}
    spread = "ONE gevent worker" if workers == 1 else f"{workers} gevent workers, the streams spread evenly"
    print(f"\n== Fan-out: {args.streams} SSE streams on one session, {spread} ==", flush=True)
    service = Service("decks", data_dir, root / f"fanout-{workers}w-service.log", workers=workers)
    fan = None
    try:
        pids = service.worker_pids
        if len(pids) != workers:
            raise RuntimeError(f"wanted {workers} workers, the service runs {len(pids)}")
        print(
            f"   service on {HOST}:{service.port}, arbiter pid {service.running.process.pid}, worker pid(s) {pids}",
            flush=True,
        )
        api = KeepAliveClient(service.port)
        api.json("POST", "/api/decks/import", import_body)
        session = api.json("POST", "/api/sessions", {"deck_id": import_body["id"]})
        sid = session["id"]
        events_path = f"/api/sessions/{sid}/events"

        # Warm-up, so that one-time costs (lazy imports, first-request caches, the
        # session's feed) do not count as per-stream memory: a few events, and a few
        # streams opened, fed and closed.
        for i in range(3):
            api.json("POST", events_path, {"type": "note", "slide": 0, "text": f"warm-up {i}"})
        warm = FanOut(service.port, sid, api.json("GET", f"/api/sessions/{sid}")["last_seq"], 5)
        warm.open(5 * workers)
        seq = api.json("POST", events_path, {"type": "note", "slide": 0, "text": "warm-up fan-out"})["seq"]
        warm.expect(seq)
        warm.done[seq].wait(EVENT_TIMEOUT_S)
        warm.close()
        for i in range(2):  # the server notices the closed streams on its next writes
            api.json("POST", events_path, {"type": "note", "slide": 0, "text": f"warm-up close {i}"})
        if args.prefill:
            t = time.perf_counter()
            post_many(service.port, events_path, args.prefill)
            print(
                f"   pre-filled the log with {args.prefill} events in {time.perf_counter() - t:.1f} s "
                f"({os.path.getsize(data_dir / 'sessions' / sid / 'events.jsonl') / 1e6:.1f} MB)",
                flush=True,
            )
        gevent.sleep(1.0)
        after = api.json("GET", f"/api/sessions/{sid}")["last_seq"]
        rss_before = sum_kb(pids, "VmRSS")
        print(f"   worker RSS before opening streams (after warm-up): {rss_before} kB", flush=True)

        fan = FanOut(service.port, sid, after, args.open_concurrency)
        t_open = time.perf_counter()
        cpu_open = sum(proc_cpu_seconds(pid) for pid in pids)
        fan.open(args.streams)
        open_seconds = time.perf_counter() - t_open
        cpu_open = sum(proc_cpu_seconds(pid) for pid in pids) - cpu_open
        opened_first = fan.opened_count
        print(
            f"   opened {fan.opened_count}/{args.streams} streams in {open_seconds:.1f} s (failed: {fan.failed})",
            flush=True,
        )
        for error, count in fan.errors().most_common(5):
            print(f"     {count} x {error}")
        by_worker = fan.spread(pids, args.streams)
        held = {pid: len(streams) for pid, streams in by_worker.items()}
        if workers > 1:
            print(
                f"   streams per worker (told apart through /proc): {held}; {fan.dropped} surplus "
                f"streams closed to even them out",
                flush=True,
            )
            # The server notices the closed streams on its next writes: two posts, not timed.
            for i in range(2):
                seq = api.json("POST", events_path, {"type": "note", "slide": 0, "text": f"spread {i}"})["seq"]
                fan.expect(seq)
                fan.done[seq].wait(EVENT_TIMEOUT_S)
        gevent.sleep(2.0)  # settle
        rss_open = sum_kb(pids, "VmRSS")
        live_at_rss = fan.live
        print(f"   worker RSS with {live_at_rss} streams open: {rss_open} kB", flush=True)
        after = api.json("GET", f"/api/sessions/{sid}")["last_seq"]
        api.close()

        posts, latencies, lasts, per_event = [], [], [], []
        local, remote = [], []  # receipts on the worker that took the POST, and on another
        worker_cpu0, client_cpu0 = sum(proc_cpu_seconds(pid) for pid in pids), self_cpu_seconds()
        busy0, t_events = machine_busy_seconds()[0], time.perf_counter()
        for i in range(args.events):
            if fan.live == 0:
                break
            body = {
                "type": "note",
                "slide": 0,
                "text": f"fan-out probe {i + 1} of {args.events}: " + "lorem ipsum " * 4,
            }
            seq_expected = after + i + 1
            poster_pid = pids[i % len(pids)]  # the posts alternate over the workers
            poster = client_on(service.port, poster_pid, pids)  # a fresh connection, made before the clock starts
            fan.expect(seq_expected)
            t0 = time.perf_counter()
            try:
                stored = poster.json("POST", events_path, body, expect=(201,))
            finally:
                poster.close()
            posts.append(time.perf_counter() - t0)
            if stored["seq"] != seq_expected:
                raise RuntimeError(f"posted event got seq {stored['seq']}, expected {seq_expected}")
            fan.done[seq_expected].wait(EVENT_TIMEOUT_S)
            arrivals = fan.arrivals.get(seq_expected, [])
            got = [t - t0 for t, _ in arrivals]
            latencies.extend(got)
            local.extend(t - t0 for t, pid in arrivals if pid == poster_pid)
            remote.extend(t - t0 for t, pid in arrivals if pid != poster_pid)
            complete = len(got) >= fan.expected[seq_expected]
            if complete and got:
                lasts.append(max(got))
            per_event.append(
                (
                    seq_expected,
                    len(got),
                    fan.expected[seq_expected],
                    percentile(got, 50),
                    percentile(got, 99),
                    max(got) if got else None,
                )
            )
            gevent.sleep(args.gap)
        events_worker_cpu = sum(proc_cpu_seconds(pid) for pid in pids) - worker_cpu0
        events_client_cpu = self_cpu_seconds() - client_cpu0
        events_seconds = time.perf_counter() - t_events
        events_other = machine_busy_seconds()[0] - busy0 - events_worker_cpu - events_client_cpu
        rss_events = sum_kb(pids, "VmRSS")
        hwm = sum_kb(pids, "VmHWM")

        if args.verbose:
            print("   seq  received/expected   p50        p99        max")
            for seq, n, exp, p50, p99, mx in per_event:
                print(f"   {seq:<4} {n:>5}/{exp:<5}          {fmt_ms(p50):>10} {fmt_ms(p99):>10} {fmt_ms(mx):>10}")

        expected_total = sum(e[2] for e in per_event)
        received_total = sum(e[1] for e in per_event)
        result.update(
            worker_pids=pids,
            held=held,
            dropped=fan.dropped,
            rss_before=rss_before,
            rss_open=rss_open,
            rss_events=rss_events,
            hwm=hwm,
            live_at_rss=live_at_rss,
            opened=opened_first,
            failed=fan.failed,
            open_seconds=open_seconds,
            open_p50=percentile(fan.open_times, 50),
            open_p99=percentile(fan.open_times, 99),
            open_worker_cpu=cpu_open,
            events=len(per_event),
            expected_total=expected_total,
            received_total=received_total,
            duplicates=sum(s.duplicates for s in fan.streams),
            gaps=sum(s.gaps for s in fan.streams),
            id_mismatches=fan.id_mismatches,
            p50=percentile(latencies, 50),
            p99=percentile(latencies, 99),
            max=max(latencies) if latencies else None,
            last_p50=percentile(lasts, 50),
            last_p99=percentile(lasts, 99),
            last_max=max(lasts) if lasts else None,
            complete_events=len(lasts),
            local_p50=percentile(local, 50),
            local_p99=percentile(local, 99),
            remote_p50=percentile(remote, 50),
            remote_p99=percentile(remote, 99),
            worst_event_p99=max((e[4] for e in per_event if e[4] is not None), default=None),
            post_p50=percentile(posts, 50),
            post_max=max(posts) if posts else None,
            events_worker_cpu=events_worker_cpu,
            events_client_cpu=events_client_cpu,
            events_seconds=events_seconds,
            events_other=max(0.0, events_other),
            kb_per_stream=(
                (rss_open - rss_before) / live_at_rss
                if rss_open is not None and rss_before is not None and live_at_rss
                else None
            ),
        )

        # Stop the service with the streams still open (and no idle keep-alive
        # connection, which would hold the worker until gunicorn's keepalive time-out).
        live_at_stop = fan.live
        stop_seconds = service.stop()
        deadline = time.monotonic() + 5
        while fan.live and time.monotonic() < deadline:
            gevent.sleep(0.05)
        result.update(
            live_at_stop=live_at_stop,
            stop_seconds=stop_seconds,
            ended_cleanly=sum(1 for s in fan.streams if s.closed_reason),
        )
        return result
    except BaseException:
        print("   --- service log tail ---\n" + service.log_tail(), file=sys.stderr)
        raise
    finally:
        if fan is not None:
            fan.close()
        service.stop()


def print_fanout(r, ncpu):
    workers = r["workers"]
    print(f"\n-- Fan-out results, {workers} worker(s) (client and service share this {ncpu}-CPU machine) --")
    if r["prefill"]:
        print(f"   (the session's log was pre-filled with {r['prefill']} events before the streams opened)")
    print(
        f"   streams opened:        {r['opened']}/{r['streams_wanted']} (failed {r['failed']}), "
        f"in {r['open_seconds']:.1f} s; time to ': stream open' p50 {fmt_ms(r['open_p50'])}, "
        f"p99 {fmt_ms(r['open_p99'])}; worker CPU for the opens {r['open_worker_cpu']:.2f} s"
    )
    if workers > 1:
        print(f"   streams per worker:    {r['held']} ({r['dropped']} surplus closed to even them out)")
    print(
        f"   events posted:         {r['events']}, each on a fresh connection to the worker(s) in turn "
        f"(spaced {r['gap']:.2f} s after each full delivery)"
    )
    print(
        f"   deliveries:            {r['received_total']}/{r['expected_total']} "
        f"(duplicates {r['duplicates']}, seq gaps {r['gaps']}, id/seq mismatches {r['id_mismatches']})"
    )
    print(
        f"   POST -> last receipt:  p50 {fmt_ms(r['last_p50'])}, p99 {fmt_ms(r['last_p99'])}, "
        f"max {fmt_ms(r['last_max'])} (per event, {r['complete_events']} fully delivered)"
    )
    print(
        f"   POST -> each receipt:  p50 {fmt_ms(r['p50'])}, p99 {fmt_ms(r['p99'])}, "
        f"max {fmt_ms(r['max'])}; worst single-event p99 {fmt_ms(r['worst_event_p99'])}"
    )
    if workers > 1:
        print(
            f"   by where the stream is: on the worker that took the POST p50 {fmt_ms(r['local_p50'])}, "
            f"p99 {fmt_ms(r['local_p99'])}; on another worker p50 {fmt_ms(r['remote_p50'])}, "
            f"p99 {fmt_ms(r['remote_p99'])}"
        )
    print(f"   POST -> 201:           p50 {fmt_ms(r['post_p50'])}, max {fmt_ms(r['post_max'])}")
    if r["events"]:
        print(
            f"   CPU per event:         workers {r['events_worker_cpu'] / r['events'] * 1000:.0f} ms, "
            f"bench client {r['events_client_cpu'] / r['events'] * 1000:.0f} ms "
            f"(incl. {r['gap']:.2f} s idle gaps); other processes on the machine meanwhile: "
            f"{r['events_other'] / r['events_seconds'] * 100:.0f}% of one CPU"
        )
    label = "worker RSS (sum):" if workers > 1 else "worker RSS:"
    print(
        f"   {label:<23}before {r['rss_before']} kB, with "
        f"{r['live_at_rss']} streams {r['rss_open']} kB, after the events {r['rss_events']} kB "
        f"(peak VmHWM {r['hwm']} kB)"
    )
    if r["kb_per_stream"] is not None:
        print(f"   RSS growth per stream: {r['kb_per_stream']:.1f} kB")
    stop = r["stop_seconds"]
    stop_text = f"killed after {STOP_TIMEOUT_S:.0f} s" if stop == float("inf") else f"{stop:.2f} s"
    print(
        f"   SIGTERM with {r['live_at_stop']} streams open: service exited in {stop_text}; "
        f"{r['ended_cleanly']} streams got the ': closed' comment"
    )


# --------------------------------------------------------------------------- appends


def raw_fsync_rate(directory, seconds):
    """Appends/s of one ~150-byte line + os.fdatasync, to a file in `directory`."""
    path = os.path.join(directory, "raw-fsync-probe.jsonl")
    line = (
        json.dumps(
            {"seq": 0, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": "x" * 70},
            separators=(",", ":"),
        )
        + "\n"
    ).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count = 0
    try:
        started = time.perf_counter()
        deadline = started + seconds
        while True:
            os.write(fd, line)
            os.fdatasync(fd)
            count += 1
            now = time.perf_counter()
            if now >= deadline or count >= 10_000_000:
                break
    finally:
        os.close(fd)
        os.unlink(path)
    return count / (now - started), len(line)


def run_appends(args, root):
    data_dir = root / "appends-data"
    data_dir.mkdir()
    import_body = copy_sample_deck(data_dir)
    print(
        f"\n== Durable appends: {args.posters} concurrent posters for {args.seconds:.0f} s, "
        f"{args.workers} gunicorn worker(s) ==",
        flush=True,
    )
    service = Service("decks", data_dir, root / "appends-service.log", workers=args.workers)
    clients = []
    try:
        pids = service.worker_pids
        print(f"   service on {HOST}:{service.port}, worker pids {pids}", flush=True)
        api = KeepAliveClient(service.port)
        api.json("POST", "/api/decks/import", import_body)
        session = api.json("POST", "/api/sessions", {"deck_id": import_body["id"]})
        sid = session["id"]
        api.close()
        path = f"/api/sessions/{sid}/events"
        log_path = data_dir / "sessions" / sid / "events.jsonl"

        fsync_before, line_bytes = raw_fsync_rate(data_dir, args.fsync_seconds)
        print(f"   raw append+fdatasync ({line_bytes} B lines) before: {fsync_before:.0f}/s", flush=True)

        acked_seqs, latencies, statuses = [], [], Counter()
        errors, bad_answers = Counter(), Counter()  # transport errors; non-201 answers
        start = Event()
        state = {"deadline": None}

        def poster(index, client):
            body = {"type": "note", "slide": 0, "author": f"poster-{index}", "text": ""}
            numbers = itertools.count(1)

            def send():
                body["text"] = f"durable append {next(numbers)} from poster {index}: " + "lorem ipsum " * 3
                return client.request("POST", path, body)

            start.wait()
            for status, _, content in timed_answers(client, send, state["deadline"], latencies, errors):
                statuses[status] += 1
                if status == 201:
                    acked_seqs.append(json.loads(content)["seq"])
                elif len(bad_answers) < 20:
                    bad_answers[f"{status}: {content[:200]!r}"] += 1

        for _index in range(args.posters):
            client = KeepAliveClient(service.port)
            client.connect()
            clients.append(client)
        greenlets = [gevent.spawn(poster, i, c) for i, c in enumerate(clients)]
        gevent.sleep(0.2)
        meter = CpuMeter(pids).start()
        t_start = time.perf_counter()
        state["deadline"] = t_start + args.seconds
        start.set()
        gevent.joinall(greenlets, timeout=args.seconds + REQUEST_TIMEOUT_S + 5)
        t_end = time.perf_counter()
        meter.stop()
        elapsed = t_end - t_start
        cpu_workers, cpu_client = meter.worker, meter.client
        cpu_other = meter.other + meter.steal  # this report counts stolen time as other processes'
        stragglers = sum(1 for g in greenlets if not g.dead)
        gevent.killall(greenlets, timeout=5)

        fsync_after, _ = raw_fsync_rate(data_dir, args.fsync_seconds)
        print(f"   raw append+fdatasync after: {fsync_after:.0f}/s", flush=True)

        # The log must hold exactly the acknowledged events, seqs 1..N, nothing else.
        with open(log_path, "rb") as f:
            lines = f.read().split(b"\n")
        torn = lines.pop() != b""  # a complete log ends with a newline
        file_seqs, bad_lines, stamps = [], 0, set()
        for line in lines:
            try:
                record = json.loads(line)
                file_seqs.append(record["seq"])
                stamps.add(record["ts"])
            except (ValueError, KeyError, TypeError):
                bad_lines += 1
        n_acked = len(acked_seqs)
        contiguous = file_seqs == list(range(1, len(file_seqs) + 1))
        acked_unique = len(set(acked_seqs)) == n_acked
        log_ok = (
            not torn
            and bad_lines == 0
            and contiguous
            and len(file_seqs) == n_acked
            and acked_unique
            and set(acked_seqs) == set(file_seqs)
        )
        fsync_rate = (fsync_before + fsync_after) / 2
        return {
            "workers": args.workers,
            "pids": pids,
            "posters": args.posters,
            "seconds": elapsed,
            "acked": n_acked,
            "rate": n_acked / elapsed if elapsed else 0.0,
            "statuses": dict(statuses),
            "errors": errors,
            "bad_answers": bad_answers,
            "stragglers": stragglers,
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
            "lines": len(file_seqs),
            "torn": torn,
            "bad_lines": bad_lines,
            "contiguous": contiguous,
            "acked_unique": acked_unique,
            "log_ok": log_ok,
            "distinct_ts": len(stamps),
            "fsync_before": fsync_before,
            "fsync_after": fsync_after,
            "fsync_rate": fsync_rate,
            "ratio": (n_acked / elapsed) / fsync_rate if elapsed and fsync_rate else None,
            "cpu_workers": cpu_workers,
            "cpu_client": cpu_client,
            "cpu_other": cpu_other,
            "line_bytes": line_bytes,
        }
    except BaseException:
        print("   --- service log tail ---\n" + service.log_tail(), file=sys.stderr)
        raise
    finally:
        for client in clients:
            client.close()
        service.stop()


def print_appends(r, ncpu):
    print(
        f"\n-- Durable append results ({r['workers']} gunicorn worker(s), pids {r['pids']}; "
        f"client and service share this {ncpu}-CPU machine) --"
    )
    print(
        f"   acknowledged (201):    {r['acked']} in {r['seconds']:.2f} s -> {r['rate']:.0f} appends/s "
        f"with {r['posters']} keep-alive posters"
    )
    others = {k: v for k, v in r["statuses"].items() if k != 201}
    print(
        f"   other answers:         {others or 'none'}; transport errors: "
        f"{sum(r['errors'].values())}; posters still running at the bound: {r['stragglers']}"
    )
    for error, count in (r["bad_answers"] + r["errors"]).most_common(5):
        print(f"     {count} x {error}")
    print(f"   POST -> 201 latency:   p50 {fmt_ms(r['p50'])}, p99 {fmt_ms(r['p99'])}, max {fmt_ms(r['max'])}")
    print(
        f"   log check:             {r['lines']} lines for {r['acked']} acks; seqs 1..N without gap "
        f"or repeat: {'yes' if r['contiguous'] else 'NO'}; acked seqs unique and equal to the log's: "
        f"{'yes' if r['acked_unique'] and r['log_ok'] else 'NO'}; torn tail: {r['torn']}; "
        f"unparsable lines: {r['bad_lines']} -> {'OK' if r['log_ok'] else 'FAILED'}"
    )
    if r["acked"]:
        print(
            f"   group commit:          {r['distinct_ts']} distinct batch timestamps (ms resolution; "
            f"a lower bound on commits) -> at most {r['acked'] / max(1, r['distinct_ts']):.1f} events/commit"
        )
    print(
        f"   raw append+fdatasync:  {r['fsync_before']:.0f}/s before, {r['fsync_after']:.0f}/s after "
        f"({r['line_bytes']} B lines, same DATA_DIR)"
    )
    if r["ratio"] is not None:
        print(f"   appends/s / raw fsync: {r['ratio']:.2f}")
    print(
        f"   CPU during the run:    workers {r['cpu_workers'] / r['seconds'] * 100:.0f}% of one CPU "
        f"({r['cpu_workers'] / max(1, r['acked']) * 1e6:.0f} us per append), bench client "
        f"{r['cpu_client'] / r['seconds'] * 100:.0f}% of one CPU, other processes "
        f"{r['cpu_other'] / r['seconds'] * 100:.0f}% of one CPU"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.decks",
        description="Deck review service benchmark: SSE fan-out and durable appends. Prints figures; asserts nothing.",
    )
    p.add_argument("--streams", type=int, default=2000, help="SSE streams to open (default 2000)")
    p.add_argument("--events", type=int, default=50, help="fan-out events to time per run (default 50)")
    p.add_argument(
        "--gap",
        type=float,
        default=0.25,
        help="seconds between a fan-out event's full delivery and the next POST (default 0.25)",
    )
    p.add_argument("--open-concurrency", type=int, default=100, help="streams being opened at once (default 100)")
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="events to post to the fan-out session before the streams open (default 0): "
        "shows what a long log costs each stream open",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="duration of the append run (default 10)")
    p.add_argument("--posters", type=int, default=50, help="concurrent posters (default 50)")
    p.add_argument("--workers", type=int, default=1, help="gunicorn workers for the append run (default 1)")
    p.add_argument(
        "--fanout-workers",
        default="1,2",
        help="worker counts of the fan-out runs, one run each, in this order (default 1,2: "
        "the 2-worker figures beside the 1-worker reference of the same run)",
    )
    p.add_argument(
        "--fsync-seconds", type=float, default=3.0, help="duration of each raw fdatasync measurement (default 3)"
    )
    p.add_argument("--only", choices=("fanout", "appends"), help="run one phase only")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 200 streams, 5 events, 3 s of appends, 1 s fsync probes"
    )
    p.add_argument("--tmp-dir", help="parent of the temporary DATA_DIRs (default: the system's, /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (data and service logs)")
    p.add_argument("-v", "--verbose", action="store_true", help="print a line per fan-out event")
    args = p.parse_args(argv)
    if args.quick:
        args.streams, args.events, args.seconds, args.fsync_seconds = 200, 5, 3.0, 1.0
    for name in ("streams", "events", "posters", "workers", "open_concurrency"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        args.fanout_workers = [int(n) for n in args.fanout_workers.split(",")]
    except ValueError:
        p.error("--fanout-workers must be a comma-separated list of worker counts, e.g. 1,2")
    if not args.fanout_workers or not all(1 <= n <= 16 for n in args.fanout_workers):
        p.error("--fanout-workers: each count must be between 1 and 16")
    if not 0 <= args.prefill <= 1_000_000:
        p.error("--prefill must be between 0 and 1000000")
    if not 0 < args.seconds <= 600 or not 0 < args.fsync_seconds <= 60 or not 0 <= args.gap <= 10:
        p.error("--seconds must be in (0, 600], --fsync-seconds in (0, 60], --gap in [0, 10]")
    return args


def main(argv=None):
    args = parse_args(argv)

    exit_on_sigterm()

    ncpu = os.cpu_count()
    soft, hard = raise_nofile()
    needed = args.streams + args.posters + 100
    if soft < needed:
        print(f"warning: RLIMIT_NOFILE is {soft}; capping --streams to {soft - args.posters - 100}")
        args.streams = max(1, soft - args.posters - 100)
    root = Path(tempfile.mkdtemp(prefix="bench-decks-", dir=args.tmp_dir))
    data_fs, work_fs = filesystem_of(root), filesystem_of(ROOT)
    print(run_header("deck service benchmark", args.quick))
    print(
        f"temporary DATA_DIRs under {root} (filesystem {data_fs[0]} on {data_fs[1]}, {data_fs[2]}; "
        f"{'same' if data_fs[0] == work_fs[0] else 'NOT the same'} filesystem as {ROOT})"
    )
    print(
        f"bench client: gevent, one greenlet per stream/poster, raw sockets, RLIMIT_NOFILE {soft}/{hard}; "
        f"it runs on the same {ncpu} CPUs as the service"
    )
    fans, app = {}, None
    try:
        if args.only in (None, "fanout"):
            for workers in args.fanout_workers:
                fans[workers] = run_fanout(args, root, workers)
                fans[workers]["gap"] = args.gap
                print_fanout(fans[workers], ncpu)
        if args.only in (None, "appends"):
            app = run_appends(args, root)
            print_appends(app, ncpu)
    finally:
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    print(f"\n== Summary ({'quick smoke run: fewer streams than the target' if args.quick else 'full run'}) ==")
    rows = []
    fan = fans.get(1)
    if fan:
        held = fan["opened"] >= TARGET_STREAMS and fan["failed"] == 0
        complete = fan["received_total"] == fan["expected_total"] and fan["expected_total"] > 0
        p99_ok = fan["p99"] is not None and fan["p99"] <= TARGET_P99_S and complete
        kb_ok = fan["kb_per_stream"] is not None and fan["kb_per_stream"] <= TARGET_KB_PER_STREAM
        rows += [
            ("SSE streams held by 1 worker", f"{fan['opened']}/{fan['streams_wanted']}", f">= {TARGET_STREAMS}", held),
            (
                "fan-out p99 POST->receipt",
                f"{fmt_ms(fan['p99'])} ({fan['received_total']}/{fan['expected_total']} delivered)",
                f"<= {TARGET_P99_S:.0f} s, all delivered",
                p99_ok,
            ),
            (
                "worker RSS growth per stream",
                f"{fan['kb_per_stream']:.1f} kB" if fan["kb_per_stream"] is not None else "-",
                f"<= {TARGET_KB_PER_STREAM:.0f} kB",
                kb_ok,
            ),
        ]
    several = {n: r for n, r in fans.items() if n > 1}
    if fan and several:
        for n, r in several.items():
            complete = r["received_total"] == r["expected_total"] and r["expected_total"] > 0
            delta = (
                r["last_p99"] - fan["last_p99"] if r["last_p99"] is not None and fan["last_p99"] is not None else None
            )
            r["several_ok"] = delta is not None and delta <= TARGET_SEVERAL_WORKERS_DELTA_S and complete
            rows.append(
                (
                    f"fan-out p99 POST->last receipt, {n} workers",
                    f"{fmt_ms(r['last_p99'])} vs {fmt_ms(fan['last_p99'])} with 1 worker: "
                    f"{'-' if delta is None else f'{delta * 1000:+.1f} ms'} "
                    f"({r['received_total']}/{r['expected_total']} delivered)",
                    f"<= 1-worker p99 + {TARGET_SEVERAL_WORKERS_DELTA_S * 1000:.0f} ms, all delivered",
                    r["several_ok"],
                )
            )
    if app:
        rate_ok = (
            app["rate"] >= TARGET_APPENDS_PER_S
            and app["log_ok"]
            and set(app["statuses"]) == {201}
            and not app["errors"]
        )
        rows.append(
            (
                f"durable appends/s ({app['workers']} worker(s))",
                f"{app['rate']:.0f}/s (raw fsync {app['fsync_rate']:.0f}/s, "
                f"ratio {app['ratio']:.2f}; log {'OK' if app['log_ok'] else 'FAILED'})",
                f">= {TARGET_APPENDS_PER_S:.0f}/s, all 201, log exact",
                rate_ok,
            )
        )
    print_targets(rows)
    if fan:
        ok = held and p99_ok and kb_ok
        print(
            f"TARGET 1 fan-out (2,000 streams, p99 <= 1 s, <= 100 kB/stream): {verdict(ok)}"
            + (" (quick run: stream count below the target)" if args.quick and not held else "")
        )
    for n, r in several.items():
        if fan:
            print(
                f"TARGET 3 fan-out across {n} workers (p99 POST -> last receipt within "
                f"{TARGET_SEVERAL_WORKERS_DELTA_S * 1000:.0f} ms of 1 worker's, same run): "
                f"{verdict(r['several_ok'])}"
            )
    if app:
        print(f"TARGET 2 durable appends (>= 800/s, 201 after fsync, exact log): {verdict(rate_ok)}")


if __name__ == "__main__":
    main()
