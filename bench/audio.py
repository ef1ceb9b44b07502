"""Audio service benchmark: speech throughput and a /ready flood, direct and through nginx. Run by hand:

    .venv/bin/python -m bench.audio            # full run (10 s of speech, 500 x /ready, 5 s probe interval)
    .venv/bin/python -m bench.audio --quick    # smoke run (3 s of speech, shorter engine runs, 3 s interval)
    .venv/bin/python -m bench.audio --only nginx   # one phase: speech, ready or nginx
    .venv/bin/python bench/audio.py --help

It starts the audio service itself with devtools.services.start (gunicorn, one
gevent worker, exactly as production), each phase on a fresh temporary DATA_DIR
(nothing seeded: the sound library is not needed, /ready only needs speech),
talks to 127.0.0.1 only, prints figures and a verdict per target, and stops the
service (and nginx) whatever happens. It asserts nothing and is never collected
as a test.

Phase 1, speech: C keep-alive clients (default 4) POST /api/audio/speech with a
100-character English text (voice en-us) for --seconds; requests/s, p50/p99
latency, and every answer must be a 200 audio/mpeg (others are counted). Beside
it, espeak-ng alone on the same text (`espeak-ng --stdout -v en-us`, text on
stdin; the service's -s 175 -p 50 -a 100 are espeak-ng's defaults), N runs one
after the other and N runs 4 at a time, and app.audio.mp3.wav_to_mp3 on the
engine's WAV (the encode the service adds), measured in this process; the
service's rate is compared with the engine's (4 at a time) and with the CPU bound
of an engine run plus an encode per request.

Phase 2, /ready flood straight to gunicorn: AUDIO_ESPEAK_BINARY is a small
wrapper script that logs the time and arguments of each engine start (a probe is
a start whose arguments are exactly `--stdout`) and AUDIO_PROBE_INTERVAL is
--interval. Each round opens --connections keep-alive connections first, lets
the server accept them, then releases one `GET /api/audio/ready` on every
connection at once (a gevent Event), so that what is timed is the server, not
connection set-up. Probes are stale-while-revalidate: the worker runs the first
probe as it starts, and afterwards an expired result is answered at once while
one probe refreshes it in the background. So the probe accounting is: exactly
one start-up probe between the service's start and round 1; none in the rounds
that end inside the start-up probe's interval; exactly one in the round played
after that interval expired (the background refresh: it may start just after the
round's last answer, so the engine log is polled for it, bounded, before counting;
a burst that outlasts the interval may run one more per further interval); and
never two probes less than one interval apart. Latency is timed per request from
just before its bytes are sent to its parsed response; the service's own
per-request time (from its request log) and the worker's CPU time during the
burst are shown beside it.

Phase 3, /ready flood through nginx (how users reach the service): the same kind
of service (fresh DATA_DIR, its own engine log) with a real nginx in front of it
(devtools.nginx.start, the production site template, which micro-caches the probe
routes for 1 s with proxy_cache_lock and proxy_cache_use_stale updating). The
same rounds, sent to nginx with `Host: audio.localhost`: the first one finds
nginx's cache empty; each round reports its latency, the X-Cache-Status counts,
how many /ready requests reached the service (its request log) and the probes,
accounted as in phase 2.

The clients run in this process on gevent (raw sockets, a minimal HTTP/1.1
client), on the same machine as the service: they compete with it for the CPUs,
so their CPU time is printed too, and so is the CPU that other processes and the
hypervisor took meanwhile (a warning says when they disturbed a measurement).
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/audio.py`
    sys.path.insert(0, str(ROOT))

from app.audio import mp3  # noqa: E402
from bench.common import (  # noqa: E402
    DISTURBED,
    HOST,
    REQUEST_TIMEOUT_S,
    CpuMeter,
    HttpError,
    KeepAliveClient,
    Service,
    child_pids,
    exit_on_sigterm,
    fmt_ms,
    log_tails,
    machine_busy_seconds,
    percentile,
    print_targets,
    proc_cpu,
    raise_nofile,
    read_response,
    run_header,
    self_cpu_seconds,
    stop_nginx,
    timed_answers,
    verdict,
)
from devtools import nginx as devnginx  # noqa: E402

ORIGIN = "https://audio.bench.example"  # AUDIO_PUBLIC_ORIGIN; the requests send no Origin
VOICE = "en-us"
# Exactly 100 characters of English.
TEXT = "The quick brown fox jumps over the lazy dog, and then the audio service reads this text back to you."
assert len(TEXT) == 100

# Targets (from the issue).
TARGET_READY_P99_S = 0.100
TARGET_READY_CONNECTIONS = 500

# Bounds: every wait below has one of these.
CONNECT_PHASE_TIMEOUT_S = 10.0  # all connections of a /ready round
ROUND_TIMEOUT_S = 30.0  # all responses of a /ready round
ENGINE_TIMEOUT_S = 30.0  # one espeak-ng run
PROBE_WAIT_S = 5.0  # a background probe to show up in the engine log after a round
# gunicorn's `keepalive` (2 s) also bounds the wait for a connection's FIRST request:
# the release must come well within it, or the server closes the waiting connections.
KEEPALIVE_S = 2.0
# nginx/sites/audio.conf.j2: proxy_cache_valid 200 503 1s on the probe routes.
NGINX_CACHE_S = 1.0
# X-Cache-Status values ($upstream_cache_status) whose request went to the service.
UPSTREAM_CACHE_STATUSES = ("MISS", "EXPIRED", "BYPASS", "REVALIDATED")
CACHE_STATUSES = ("HIT", "MISS", "UPDATING", "STALE", "EXPIRED")


# --------------------------------------------------------------------------- helpers


def children_cpu_seconds():
    """CPU of this process's waited-for children (the engine runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class OtherMeter:
    """CPU the rest of the machine (neither this process nor its children) used
    meanwhile: another job on the machine disturbs the figures."""

    def start(self):
        self.t0, self.b0 = time.perf_counter(), machine_busy_seconds()
        self.own0 = self_cpu_seconds() + children_cpu_seconds()
        return self

    def stop(self):
        busy, steal = machine_busy_seconds()
        own = self_cpu_seconds() + children_cpu_seconds() - self.own0
        self.seconds = time.perf_counter() - self.t0
        self.steal = steal - self.b0[1]
        self.other = max(0.0, busy - self.b0[0] - self.steal - own)
        return self


def counting_engine(directory, binary):
    """A wrapper around espeak-ng that logs the wall-clock time and the arguments
    of each start (as tests/support/audio.py's counting_engine logs the arguments).
    bash, for $EPOCHREALTIME without starting one more process. Returns (script, log)."""
    log = Path(directory) / "engine.log"
    script = Path(directory) / "espeak-wrapper"
    bash = shutil.which("bash") or "/bin/bash"
    script.write_text(f'#!{bash}\nprintf \'%s %s\\n\' "${{EPOCHREALTIME/,/.}}" "$*" >> {log}\nexec {binary} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


class EngineLog:
    """The wrapper's log: every engine start, with its time on this process's
    perf_counter clock. A probe is a start whose arguments are exactly `--stdout`."""

    def __init__(self, path):
        self.path = path
        self.offset = time.time() - time.perf_counter()  # wall clock -> perf_counter

    def entries(self):
        """[(perf_counter time or None, arguments)] of every start logged so far."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        lines = text.splitlines()
        if text and not text.endswith("\n"):
            lines.pop()  # a line being written: it is read complete next time
        found = []
        for line in lines:
            stamp, _, arguments = line.partition(" ")
            try:
                when = float(stamp) - self.offset
            except ValueError:
                when = None
            found.append((when, arguments.strip()))
        return found

    def mark(self):
        return len(self.entries())

    def between(self, start, end=None):
        """(probe start times, number of starts) logged between two marks."""
        chosen = self.entries()[start:end]
        return [when for when, arguments in chosen if arguments == "--stdout"], len(chosen)

    def probe_times(self):
        return self.between(0)[0]

    def wait_probes(self, start, want, timeout):
        """Poll (bounded) until at least `want` probes are logged since mark `start`;
        returns the seconds waited."""
        t0 = time.perf_counter()
        deadline = t0 + timeout
        while len(self.between(start)[0]) < want and time.perf_counter() < deadline:
            gevent.sleep(0.05)
        return time.perf_counter() - t0


def mp3_quality():
    """The LAME quality app.audio.mp3 sets (read from its source: it is a literal), or None."""
    value = getattr(mp3, "QUALITY", None)
    if value is not None:
        return value
    try:
        match = re.search(r"set_quality\((\w+)\)", inspect.getsource(mp3))
    except (OSError, TypeError):
        return None
    if not match:
        return None
    token = match.group(1)
    return int(token) if token.isdigit() else getattr(mp3, token, token)


class AudioService(Service):
    """The audio service, which reads its own request log back."""

    def __init__(self, data_dir, env, log_path):
        super().__init__("audio", data_dir, log_path, env=env)

    def log_size(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def request_times(self, offset, method, path):
        """The service's own durations (seconds) of `method path` requests logged
        after byte `offset` of its log, by status."""
        pattern = re.compile(rf" bundle\.request {method} {re.escape(path)} (\d+) ([0-9.]+)ms ")
        found = {}
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            for line in f.read().decode(errors="replace").splitlines():
                match = pattern.search(line)
                if match:
                    found.setdefault(int(match.group(1)), []).append(float(match.group(2)) / 1000)
        return found


# --------------------------------------------------------------------------- engine alone


def engine_run(binary, text):
    """(seconds, WAV bytes) of one `espeak-ng --stdout -v en-us` with `text` on stdin."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [binary, "--stdout", "-v", VOICE], input=text.encode(), capture_output=True, timeout=ENGINE_TIMEOUT_S
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0 or not done.stdout.startswith(b"RIFF"):
        raise RuntimeError(f"espeak-ng failed ({done.returncode}): {done.stderr[:300]!r}")
    return seconds, done.stdout


def run_engine_alone(args, binary):
    print(
        f"\n== espeak-ng alone: {args.engine_runs} runs one at a time, {args.engine_runs} runs "
        f"{args.clients} at a time, then wav_to_mp3 x {args.encode_runs} ==",
        flush=True,
    )
    engine_run(binary, TEXT)  # warm the page cache
    meter = OtherMeter().start()
    sequential = []
    t0 = time.perf_counter()
    for _ in range(args.engine_runs):
        seconds, wav = engine_run(binary, TEXT)
        sequential.append(seconds)
    sequential_wall = time.perf_counter() - t0

    parallel, left = [], [args.engine_runs]

    def runner():
        while left[0] > 0:
            left[0] -= 1
            parallel.append(engine_run(binary, TEXT)[0])

    busy0 = machine_busy_seconds()[0]
    t0 = time.perf_counter()
    greenlets = [gevent.spawn(runner) for _ in range(args.clients)]
    gevent.joinall(greenlets, timeout=args.engine_runs * ENGINE_TIMEOUT_S, raise_error=True)
    parallel_wall = time.perf_counter() - t0
    parallel_busy = machine_busy_seconds()[0] - busy0

    encodes = []
    for _ in range(args.encode_runs):
        t = time.perf_counter()
        audio = mp3.wav_to_mp3(wav)
        encodes.append(time.perf_counter() - t)
    pcm, rate, channels = mp3.pcm_of_wav(wav)
    meter.stop()
    return {
        "other": meter.other / meter.seconds,
        "steal": meter.steal / meter.seconds,
        "runs": args.engine_runs,
        "parallel_n": args.clients,
        "seq_p50": percentile(sequential, 50),
        "seq_mean": sum(sequential) / len(sequential),
        "seq_rate": len(sequential) / sequential_wall,
        "par_p50": percentile(parallel, 50),
        "par_mean": sum(parallel) / len(parallel),
        "par_rate": len(parallel) / parallel_wall,
        "par_busy": parallel_busy / parallel_wall,
        "wav_bytes": len(wav),
        "audio_seconds": len(pcm) / (2 * channels * rate),
        "rate": rate,
        "mp3_bytes": len(audio),
        "encode_p50": percentile(encodes, 50),
        "encode_mean": sum(encodes) / len(encodes),
        "encode_runs": len(encodes),
    }


def print_engine(e, ncpu):
    print(f"\n-- espeak-ng alone (same {len(TEXT)}-character text, voice {VOICE}; {ncpu}-CPU machine) --")
    print(f"   WAV:                   {e['wav_bytes']} bytes, {e['audio_seconds']:.2f} s of audio at {e['rate']} Hz")
    print(
        f"   one at a time:         {e['runs']} runs, per run p50 {fmt_ms(e['seq_p50'])}, mean "
        f"{fmt_ms(e['seq_mean'])} -> {e['seq_rate']:.1f} runs/s"
    )
    print(
        f"   {e['parallel_n']} at a time:           {e['runs']} runs, per run p50 {fmt_ms(e['par_p50'])}, mean "
        f"{fmt_ms(e['par_mean'])} -> {e['par_rate']:.1f} runs/s (machine busy "
        f"{e['par_busy'] * 100:.0f}% of one CPU)"
    )
    print(
        f"   meanwhile:             other processes {e['other'] * 100:.0f}% of one CPU, stolen by the "
        f"hypervisor {e['steal'] * 100:.0f}%"
    )
    print(
        f"   wav_to_mp3 (lameenc):  {e['encode_runs']} encodes, p50 {fmt_ms(e['encode_p50'])}, mean "
        f"{fmt_ms(e['encode_mean'])} -> {e['mp3_bytes']} bytes of MP3 "
        f"({mp3.BIT_RATE_KBPS} kb/s); one engine run + one encode, one at a time: "
        f"{fmt_ms(e['seq_mean'] + e['encode_mean'])}"
    )


# --------------------------------------------------------------------------- speech


def run_speech(args, root, binary):
    data_dir = root / "speech-data"
    data_dir.mkdir()
    print(
        f"\n== Speech: {args.clients} keep-alive clients POST /api/audio/speech for {args.seconds:.0f} s, "
        f"ONE gevent worker ==",
        flush=True,
    )
    # The clients all come from this one address: the service's per-address speech
    # limits are raised out of their way (this measures throughput, not the limits).
    service = AudioService(
        data_dir,
        {
            "AUDIO_PUBLIC_ORIGIN": ORIGIN,
            "AUDIO_ESPEAK_BINARY": binary,
            "AUDIO_SPEECH_PER_MINUTE": "1000000",
            "AUDIO_SPEECH_CONCURRENT_PER_ADDRESS": str(args.clients),
            "AUDIO_SYNTHESIS_QUEUE": str(args.clients),
        },
        root / "speech-service.log",
    )
    clients = []
    try:
        print(f"   service on {HOST}:{service.port}, worker pid {service.worker_pid}", flush=True)
        body = json.dumps({"text": TEXT, "voiceId": VOICE}).encode()
        headers = {"X-App-Request": "1", "Content-Type": "application/json"}
        path = "/api/audio/speech"

        warm = KeepAliveClient(service.port)  # voice list, first probe, first-request costs
        for _ in range(2):
            status, response_headers, content = warm.request("POST", path, body, headers)
            if status != 200:
                raise HttpError(f"warm-up POST {path} -> {status}: {content[:300]!r}")
        warm.close()
        mp3_bytes = len(content)

        latencies, answers, errors, bad = [], Counter(), Counter(), Counter()
        start, state = Event(), {"deadline": None}

        def client_loop(client):
            start.wait()
            answers_of = timed_answers(
                client, lambda: client.request("POST", path, body, headers), state["deadline"], latencies, errors
            )
            for status, response_headers, content in answers_of:
                kind = response_headers.get("content-type", "-")
                answers[(status, kind)] += 1
                if (status != 200 or kind != "audio/mpeg" or not content) and len(bad) < 20:
                    bad[f"{status} {kind}: {content[:200]!r}"] += 1

        for _ in range(args.clients):
            client = KeepAliveClient(service.port)
            client.connect()
            clients.append(client)
        greenlets = [gevent.spawn(client_loop, c) for c in clients]
        gevent.sleep(0.2)
        meter = CpuMeter([service.worker_pid]).start()
        state["deadline"] = meter.t0 + args.seconds
        start.set()
        gevent.joinall(greenlets, timeout=args.seconds + REQUEST_TIMEOUT_S + 5)
        meter.stop()
        stragglers = sum(1 for g in greenlets if not g.dead)
        gevent.killall(greenlets, timeout=5)
        ok = answers.get((200, "audio/mpeg"), 0)
        done = sum(answers.values())
        return {
            "clients": args.clients,
            "seconds": meter.seconds,
            "requests": done,
            "ok": ok,
            "rate": ok / meter.seconds if meter.seconds else 0.0,
            "others": {f"{s} {k}": n for (s, k), n in answers.items() if (s, k) != (200, "audio/mpeg")},
            "errors": errors,
            "bad": bad,
            "stragglers": stragglers,
            "mp3_bytes": mp3_bytes,
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
            "cpu": meter,
        }
    except BaseException:
        print(log_tails(service), file=sys.stderr)
        raise
    finally:
        for client in clients:
            client.close()
        service.stop()


def print_speech(r, engine, ncpu):
    cpu = r["cpu"]
    print(f"\n-- Speech results (one gunicorn worker; client and service share this {ncpu}-CPU machine) --")
    print(
        f"   200 audio/mpeg:        {r['ok']} in {r['seconds']:.2f} s -> {r['rate']:.1f} requests/s with "
        f"{r['clients']} keep-alive clients ({r['mp3_bytes']} bytes of MP3 each)"
    )
    print(
        f"   other answers:         {r['others'] or 'none'}; transport errors: {sum(r['errors'].values())}; "
        f"clients still running at the bound: {r['stragglers']}"
    )
    for error, count in (r["bad"] + r["errors"]).most_common(5):
        print(f"     {count} x {error}")
    print(f"   latency:               p50 {fmt_ms(r['p50'])}, p99 {fmt_ms(r['p99'])}, max {fmt_ms(r['max'])}")
    if engine:
        ratio = r["rate"] / engine["par_rate"] if engine["par_rate"] else None
        r["ratio"] = ratio
        print(
            f"   vs espeak-ng alone:    {engine['par_rate']:.1f} runs/s {engine['parallel_n']} at a time, "
            f"{engine['seq_rate']:.1f} runs/s one at a time -> service/engine-alone "
            f"({engine['parallel_n']} at a time) = {ratio:.2f}"
        )
        # Each request costs an engine run plus an encode, both CPU-bound: on ncpu CPUs
        # the service cannot beat ncpu / (engine + encode) requests/s.
        ceiling = ncpu / (engine["seq_mean"] + engine["encode_mean"])
        print(
            f"   vs engine + encode:    {ncpu} CPUs / ({fmt_ms(engine['seq_mean'])} + "
            f"{fmt_ms(engine['encode_mean'])}) = {ceiling:.1f} requests/s at best -> the service reaches "
            f"{r['rate'] / ceiling * 100:.0f}% of it"
        )
    n = max(1, r["ok"])
    print(
        f"   CPU during the run:    worker {cpu.pct(cpu.worker)} of one CPU ({cpu.worker / n * 1000:.1f} ms per "
        f"request, incl. the MP3 encode), espeak-ng processes {cpu.pct(cpu.engines)} "
        f"({cpu.engines / n * 1000:.1f} ms per request), bench client {cpu.pct(cpu.client)}, "
        f"other processes {cpu.pct(cpu.other)}, stolen by the hypervisor {cpu.pct(cpu.steal)}"
    )


# --------------------------------------------------------------------------- /ready flood


def ready_round(port, connections, settle, host, through_proxy=False, worker_pid=None):
    """Open `connections` connections, then send one GET /api/audio/ready on each
    at once (with `host` as its Host header). Returns the round's figures (with the
    worker's CPU time from the release to the last answer when `worker_pid` is
    given, and the X-Cache-Status counts when `through_proxy`)."""
    request = f"GET /api/audio/ready HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    release, all_connected = Event(), Event()
    state = {"connected": 0, "failed_connect": 0, "t_release": None}
    sends, dones, latencies, statuses, errors, cache = [], [], [], Counter(), Counter(), Counter()
    upstream_dones = []  # answers that came from the service (not from nginx's cache)
    socks = []

    def arrived():
        if state["connected"] + state["failed_connect"] >= connections:
            all_connected.set()

    def one():
        try:
            sock = socket.create_connection((HOST, port), timeout=REQUEST_TIMEOUT_S)
        except OSError as exc:
            state["failed_connect"] += 1
            errors[f"connect: {type(exc).__name__}: {exc}"] += 1
            arrived()
            return
        socks.append(sock)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state["connected"] += 1
        arrived()
        release.wait()
        try:
            t_send = time.perf_counter()
            sock.sendall(request)
            status, headers, content, _ = read_response(sock, b"", "GET /api/audio/ready")
            t_done = time.perf_counter()
        except (OSError, ConnectionError, HttpError, ValueError) as exc:
            errors[f"{type(exc).__name__}: {exc}"] += 1
            return
        sends.append(t_send)
        dones.append(t_done)
        statuses[status] += 1
        latencies.append(t_done - t_send)
        if through_proxy:
            cached = headers.get("x-cache-status") or "-"
            cache[cached] += 1
            if cached in UPSTREAM_CACHE_STATUSES:
                upstream_dones.append(t_done)
        else:
            upstream_dones.append(t_done)

    client_cpu0 = self_cpu_seconds()
    t_connect = time.perf_counter()
    greenlets = [gevent.spawn(one) for _ in range(connections)]
    try:
        all_connected.wait(CONNECT_PHASE_TIMEOUT_S)
        connect_seconds = time.perf_counter() - t_connect
        gevent.sleep(settle)  # the server accepts them and waits for their first request
        worker_before = proc_cpu(worker_pid) if worker_pid else None
        cpu_before_release = self_cpu_seconds()
        state["t_release"] = time.perf_counter()
        release.set()
        gevent.joinall(greenlets, timeout=ROUND_TIMEOUT_S)
        cpu_burst = self_cpu_seconds() - cpu_before_release
        worker_after = proc_cpu(worker_pid) if worker_pid else None
        stragglers = sum(1 for g in greenlets if not g.dead)
    finally:
        gevent.killall(greenlets, timeout=5)
        for sock in socks:
            sock.close()
    t_release = state["t_release"]
    from_release = [d - t_release for d in dones]
    return {
        "connections": connections,
        "connected": state["connected"],
        "connect_seconds": connect_seconds,
        "settle": settle,
        "t_connect": t_connect,
        "t_release": t_release,
        "first_done": min(dones) if dones else None,
        "last_done": max(dones) if dones else None,
        "first_upstream_done": min(upstream_dones) if upstream_dones else None,
        "last_upstream_done": max(upstream_dones) if upstream_dones else None,
        "answered": len(latencies),
        "statuses": dict(statuses),
        "errors": errors,
        "stragglers": stragglers,
        "cache": cache,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies) if latencies else None,
        "rel_p50": percentile(from_release, 50),
        "rel_p99": percentile(from_release, 99),
        "rel_max": max(from_release) if from_release else None,
        "send_spread": (max(sends) - t_release) if sends else None,
        "client_cpu_burst": cpu_burst,
        "client_cpu_round": self_cpu_seconds() - client_cpu0,
        "worker_cpu_burst": (worker_after[0] - worker_before[0]) if worker_before and worker_after else None,
    }


def run_flood(args, root, binary, through_nginx=False):
    """The /ready rounds against one fresh service, straight to gunicorn or
    through a real nginx in front of it."""
    name = "nginx" if through_nginx else "ready"
    data_dir, engine_dir = root / f"{name}-data", root / f"{name}-engine"
    data_dir.mkdir()
    engine_dir.mkdir()
    script, engine_log_path = counting_engine(engine_dir, binary)
    engine_log = EngineLog(engine_log_path)
    interval = args.interval
    if through_nginx:
        print(
            f"\n== /ready flood THROUGH NGINX: {args.connections} concurrent GET /api/audio/ready with "
            f"Host: {default_audio_host()}, nginx micro-cache {NGINX_CACHE_S:g} s, probe interval "
            f"{interval:g} s, ONE gevent worker behind it ==",
            flush=True,
        )
    else:
        print(
            f"\n== /ready flood straight to gunicorn: {args.connections} concurrent GET /api/audio/ready, "
            f"probe interval {interval:g} s, ONE gevent worker ==",
            flush=True,
        )
    if args.connections + 100 > resource.getrlimit(resource.RLIMIT_NOFILE)[0]:
        raise RuntimeError("RLIMIT_NOFILE is too low for --connections")
    t_service = time.perf_counter()
    service = AudioService(
        data_dir,
        {"AUDIO_PUBLIC_ORIGIN": ORIGIN, "AUDIO_ESPEAK_BINARY": str(script), "AUDIO_PROBE_INTERVAL": f"{interval:g}"},
        root / f"{name}-service.log",
    )
    proxy = None
    rounds = []
    try:
        print(
            f"   service on {HOST}:{service.port} (started in {time.perf_counter() - t_service:.2f} s), "
            f"worker pid {service.worker_pid}; engine wrapper {script} (logs each start)",
            flush=True,
        )
        if through_nginx:
            # Every round comes from this one address on purpose: the site's per-address
            # limit of the probe routes is raised out of the rounds' way.
            proxy = devnginx.start(
                root / "nginx-prefix",
                None,
                {"audio": f"{HOST}:{service.port}"},
                variables={"audio_probe_burst": args.connections * (args.rounds + 2)},
            )
            proxy_pids = [proxy.process.pid, *child_pids(proxy.process.pid)]
            port, host = proxy.port, proxy.host("audio")
            print(
                f"   nginx {proxy.url} (prefix {proxy.prefix}), pids {proxy_pids} (master, worker, cache "
                f"manager and loader); requests sent with Host: {host}",
                flush=True,
            )
        else:
            port, host, proxy_pids = service.port, f"{HOST}:{service.port}", ()

        # The worker starts the first probe as it boots: wait (bounded) to see it.
        waited = engine_log.wait_probes(0, 1, PROBE_WAIT_S)
        first_probe = (engine_log.probe_times() or [None])[0]
        # Its result is stamped when it ends, so at or after it started: it is
        # surely valid until `inside_until`. (Refined below: it is surely expired
        # by `expires_by`.)
        inside_until = (first_probe if first_probe is not None else t_service) + interval
        timing = {"inside_until": inside_until, "expires_by": None}
        print(
            "   start-up probe: "
            + (
                f"started {first_probe - t_service:.2f} s after the service was "
                f"started (seen after waiting {waited:.2f} s)"
                if first_probe is not None
                else f"NOT seen within {PROBE_WAIT_S:g} s"
            ),
            flush=True,
        )
        marks = {"last": 0}

        def window(r):
            end = r["last_done"] if r["last_done"] is not None else r["t_end"]
            if end < timing["inside_until"]:
                return "inside"
            if timing["expires_by"] is not None and r["t_release"] > timing["expires_by"]:
                return "after"
            return "straddle"

        def play(label):
            mark0 = engine_log.mark()
            log0 = service.log_size()
            meter = CpuMeter([service.worker_pid], proxy_pids).start()
            r = ready_round(port, args.connections, args.settle, host, through_nginx, service.worker_pid)
            meter.stop()
            r["t_end"] = time.perf_counter()
            if not rounds:
                # Every answer carried a probe result, so the start-up probe's result was
                # stamped before the first answer that came from the service.
                stamped_by = r["first_upstream_done"] or r["last_done"] or r["t_end"]
                timing["expires_by"] = stamped_by + interval
            gevent.sleep(0.05)  # the request log lines are written before each response: all there
            server = service.request_times(log0, "GET", "/api/audio/ready")
            server_all = [t for times in server.values() for t in times]
            r.update(
                label=label,
                cpu=meter,
                server_p50=percentile(server_all, 50),
                server_p99=percentile(server_all, 99),
                server_max=max(server_all) if server_all else None,
                server_n=len(server_all),
            )
            r["window"] = window(r)
            lo, hi = expected_probes(r, interval)
            # A background refresh may start just after the round's last answer: poll for it, bounded.
            r["probe_wait"] = engine_log.wait_probes(mark0, max(1, lo), PROBE_WAIT_S) if hi >= 1 else 0.0
            mark1 = engine_log.mark()
            probes, starts = engine_log.between(mark0, mark1)
            before = engine_log.between(marks["last"], mark0)[0]  # between the previous round (or start) and this one
            marks["last"] = mark1
            r.update(
                probes=len(probes), probe_times=probes, starts=starts, probes_before=len(before), expected=(lo, hi)
            )
            rounds.append(r)
            cache = (
                "; X-Cache-Status " + fmt_cache(r["cache"]) + f"; {r['server_n']} reached the service"
                if through_nginx
                else ""
            )
            print(
                f"   round {len(rounds)} ({label}; {r['window']}): {r['answered']}/{args.connections} answered "
                f"{r['statuses']}, p50 {fmt_ms(r['p50'])}, p99 {fmt_ms(r['p99'])}, max {fmt_ms(r['max'])}"
                f"{cache}; probes {r['probes']}",
                flush=True,
            )
            if not through_nginx and r["connect_seconds"] + r["settle"] > KEEPALIVE_S * 0.75:
                print(
                    f"   warning: connecting took {r['connect_seconds']:.2f} s; gunicorn closes connections "
                    f"without a request after {KEEPALIVE_S:g} s",
                    flush=True,
                )
            return r

        first = play("first round, nginx's cache empty" if through_nginx else "first round")
        startup_probes = first["probes_before"]
        for _ in range(args.rounds - 1):
            last = rounds[-1]
            needed = last["t_end"] - last["t_connect"] + last["probe_wait"] + 0.3
            if time.perf_counter() + needed > timing["inside_until"] - 0.2:
                print(
                    f"   (no time left in the start-up probe's {interval:g} s interval for another round)", flush=True
                )
                break
            play("inside the interval")
        # After the start-up probe's interval surely expired (and, through nginx, its
        # 1 s entry too, so that a request reaches the service).
        resume = timing["expires_by"] + 0.5
        if through_nginx:
            last_fetch = max((x["last_upstream_done"] for x in rounds if x["last_upstream_done"]), default=0.0)
            resume = max(resume, last_fetch + NGINX_CACHE_S + 0.3)
        wait = resume - time.perf_counter()
        if wait > 0:
            gevent.sleep(wait)
        play("after the interval expired")
        gevent.sleep(0.05)
        tail = len(engine_log.between(marks["last"])[0])  # probes after the last round was counted
        probe_times = engine_log.probe_times()
        gaps = [b - a for a, b in zip(probe_times, probe_times[1:]) if a is not None and b is not None]
        return {
            "rounds": rounds,
            "connections": args.connections,
            "interval": interval,
            "worker_pid": service.worker_pid,
            "through_nginx": through_nginx,
            "startup_probes": startup_probes,
            "first_probe": first_probe,
            "t_service": t_service,
            "tail_probes": tail,
            "probe_times": probe_times,
            "gaps": gaps,
            "nginx": {"url": proxy.url, "pids": proxy_pids} if proxy else None,
        }
    except BaseException:
        print(log_tails(service, proxy), file=sys.stderr)
        raise
    finally:
        try:
            if proxy is not None:
                stop_nginx(proxy)
        finally:
            service.stop()


def default_audio_host():
    return devnginx.default_host("audio")


def fmt_cache(counts):
    shown = [f"{name} {counts.get(name, 0)}" for name in CACHE_STATUSES]
    shown += [f"{name} {n}" for name, n in sorted(counts.items()) if name not in CACHE_STATUSES]
    return ", ".join(shown)


def expected_probes(x, interval):
    """(fewest, most) provider probes a round may run at one probe per interval,
    stale-while-revalidate: a round inside the start-up probe's interval runs none;
    a round after it expired runs exactly one (the background refresh the first
    request starts), plus one per further interval the burst lasts; one that may
    straddle the expiry, none or that many. A round none of whose requests reached
    the service (all answered by nginx's cache) runs none."""
    if x["server_n"] == 0 or x["window"] == "inside":
        return 0, 0
    span = (x["last_done"] - x["t_release"]) if x["last_done"] is not None else 0.0
    extra = int(span // interval)
    return (1 if x["window"] == "after" else 0), 1 + extra


WINDOWS = {
    "inside": "ends inside the start-up probe's interval",
    "after": "starts after that interval surely expired",
    "straddle": "may straddle the end of that interval",
}


def fmt_range(lo, hi):
    return str(lo) if lo == hi else f"{lo} to {hi}"


def probes_ok(r):
    """Exactly one probe per interval: one start-up probe before round 1, each
    round within its expected range, none between rounds, and no two probe
    starts less than one interval apart."""
    gap_ok = all(gap >= r["interval"] - 0.005 for gap in r["gaps"])
    between = sum(x["probes_before"] for x in r["rounds"][1:]) + r["tail_probes"]
    return (
        r["startup_probes"] == 1
        and between == 0
        and gap_ok
        and all(lo <= x["probes"] <= hi for x in r["rounds"] for lo, hi in [x["expected"]])
    )


def fmt_probes(r):
    between = sum(x["probes_before"] for x in r["rounds"][1:]) + r["tail_probes"]
    return (
        f"start-up {r['startup_probes']}; rounds "
        + ", ".join(str(x["probes"]) for x in r["rounds"])
        + (f"; between rounds {between}" if between else "")
    )


def worst_p99(r, rounds=None):
    return max((x["p99"] for x in (r["rounds"] if rounds is None else rounds) if x["p99"] is not None), default=None)


def all_answered(r):
    return all(x["answered"] == x["connections"] and set(x["statuses"]) == {200} for x in r["rounds"])


def print_flood(r, ncpu):
    if r["through_nginx"]:
        print(
            f"\n-- /ready through nginx ({r['connections']} connections to nginx opened first, then one "
            f"request on each released at once; nginx {r['nginx']['url']}, one worker process; behind it "
            f"one gunicorn worker, pid {r['worker_pid']}; client, nginx and service share this {ncpu}-CPU "
            f"machine) --"
        )
        print(
            f"   X-Cache-Status: HIT = from nginx's {NGINX_CACHE_S:g} s cache; MISS = no entry, this request "
            "went to the service, and the others wait on proxy_cache_lock (nginx polls the lock every"
        )
        print(
            "   500 ms, then answers them from the cache: HIT); EXPIRED = went to the service to refresh an "
            "expired entry; UPDATING = the expired entry, answered while that refresh runs;"
        )
        print("   'reached the service' = /ready lines in its request log")
    else:
        print(
            f"\n-- /ready straight to gunicorn ({r['connections']} connections opened first, then one request "
            f"on each released at once; ONE gunicorn worker, pid {r['worker_pid']}; client and service share "
            f"this {ncpu}-CPU machine) --"
        )
    print(
        "   latency = from just before a request's bytes are sent to its parsed response; 'from release' = "
        "from the moment all were released;"
    )
    print("   'in app' = the service's own time per request (its request log: Flask before_request to after_request)")
    if r["first_probe"] is not None:
        starts = ", ".join(f"{t - r['t_service']:.2f}" for t in r["probe_times"] if t is not None)
        print(
            f"   provider probes:       {r['startup_probes']} between the service's start and round 1 (expected "
            f"exactly 1: the start-up probe); all probe starts at [{starts}] s after the service's start; "
            f"shortest gap "
            + (f"{min(r['gaps']):.2f} s" if r["gaps"] else "-")
            + f" (at least the {r['interval']:g} s interval expected)"
        )
    else:
        print("   provider probes:       NO start-up probe seen before round 1")
    for i, x in enumerate(r["rounds"], 1):
        cpu = x["cpu"]
        lo, hi = x["expected"]
        print(f"   round {i}: {x['label']} ({WINDOWS[x['window']]})")
        print(
            f"     answers:             {x['answered']}/{x['connections']} {x['statuses']}; transport errors "
            f"{sum(x['errors'].values())}; connections opened in {x['connect_seconds'] * 1000:.0f} ms "
            f"(+{x['settle'] * 1000:.0f} ms settle)"
        )
        for error, count in x["errors"].most_common(3):
            print(f"       {count} x {error}")
        print(
            f"     latency:             p50 {fmt_ms(x['p50'])}, p99 {fmt_ms(x['p99'])}, max {fmt_ms(x['max'])}; "
            f"from release p50 {fmt_ms(x['rel_p50'])}, p99 {fmt_ms(x['rel_p99'])}, max {fmt_ms(x['rel_max'])} "
            f"(all sent within {fmt_ms(x['send_spread'])} of the release)"
        )
        if r["through_nginx"]:
            print(
                f"     X-Cache-Status:      {fmt_cache(x['cache'])}; /ready requests that reached the service: "
                f"{x['server_n']}"
            )
        burst = (x["last_done"] - x["t_release"]) if x["last_done"] else None
        print(
            f"     in app:              p50 {fmt_ms(x['server_p50'])}, p99 {fmt_ms(x['server_p99'])}, max "
            f"{fmt_ms(x['server_max'])} ({x['server_n']} logged)"
        )
        if burst:
            wcpu = x["worker_cpu_burst"]
            print(
                f"     burst:               release -> last answer {fmt_ms(burst)} ({x['answered'] / burst:.0f} "
                f"answers/s); gunicorn worker CPU meanwhile {fmt_ms(wcpu)}"
                + (
                    f" = {wcpu / burst * 100:.0f}% of the burst, {wcpu / max(1, x['answered']) * 1e6:.0f} us per answer"
                    if wcpu is not None
                    else ""
                )
            )
        late = ""
        if x["probes"] and x["last_done"] is not None and x["probe_times"] and x["probe_times"][0] is not None:
            late = f"; it started {(x['probe_times'][0] - x['last_done']) * 1000:+.0f} ms from the last answer"
        print(
            f"     provider probes:     {x['probes']} (expected {fmt_range(lo, hi)}"
            + (", the burst outlasted the interval" if hi > 1 else "")
            + (f"; engine log polled {x['probe_wait']:.2f} s for it" if hi >= 1 else "")
            + f"{late}); engine starts {x['starts']}"
            + (
                f"; {x['probes_before']} probe(s) BETWEEN the previous round and this one"
                if i > 1 and x["probes_before"]
                else ""
            )
        )
        per_request = cpu.worker / max(1, x["answered"]) * 1e6
        proxy = f"nginx {cpu.proxy * 1000:.0f} ms, " if r["through_nginx"] else ""
        print(
            f"     CPU of the round:    gunicorn worker {cpu.worker * 1000:.0f} ms ({per_request:.0f} us per "
            f"answer), engine {cpu.engines * 1000:.0f} ms, {proxy}bench client {x['client_cpu_round'] * 1000:.0f} ms "
            f"({x['client_cpu_burst'] * 1000:.0f} ms of it from the release to the last answer), other "
            f"processes {cpu.other * 1000:.0f} ms, stolen {cpu.steal * 1000:.0f} ms, over {cpu.seconds:.2f} s"
        )
    if r["tail_probes"]:
        print(f"   {r['tail_probes']} probe(s) AFTER the last round was counted")
    print(f"   one probe per interval: {verdict(probes_ok(r))} ({fmt_probes(r)})")


# --------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench.audio",
        description="Audio service benchmark: speech throughput and a /ready flood, straight to gunicorn and "
        "through nginx. Prints figures; asserts nothing.",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="duration of the speech run (default 10)")
    p.add_argument(
        "--clients", type=int, default=4, help="concurrent speech clients, and engine runs at a time (default 4)"
    )
    p.add_argument("--engine-runs", type=int, default=60, help="espeak-ng runs alone, each way (default 60)")
    p.add_argument("--encode-runs", type=int, default=20, help="wav_to_mp3 encodes timed (default 20)")
    p.add_argument(
        "--connections",
        type=int,
        default=TARGET_READY_CONNECTIONS,
        help=f"concurrent /ready requests per round (default {TARGET_READY_CONNECTIONS})",
    )
    p.add_argument("--interval", type=float, default=5.0, help="AUDIO_PROBE_INTERVAL in seconds (default 5)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="/ready rounds inside the start-up probe's interval, time allowing (default 3); one "
        "more runs after the interval expired; the same for the nginx phase",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=0.3,
        help="seconds between the last connection opened and the release (default 0.3)",
    )
    p.add_argument(
        "--only",
        choices=("speech", "ready", "nginx"),
        help="run one phase only: speech, ready (the flood straight to gunicorn) or nginx (the flood through nginx)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3 s of speech, 12 engine runs, 5 encodes, 3 s probe interval, 2 rounds",
    )
    p.add_argument("--tmp-dir", help="parent of the temporary DATA_DIRs (default: the system's, /tmp)")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (data, service logs, engine logs, nginx prefix)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.engine_runs, args.encode_runs, args.interval, args.rounds = 3.0, 12, 5, 3.0, 2
    for name in ("clients", "engine_runs", "encode_runs", "connections", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.seconds <= 600 or not 1 <= args.interval <= 60 or not 0 <= args.settle <= 1:
        p.error("--seconds must be in (0, 600], --interval in [1, 60], --settle in [0, 1]")
    if args.engine_runs > 10_000 or args.encode_runs > 10_000 or args.connections > 20_000 or args.rounds > 50:
        p.error("--engine-runs, --encode-runs at most 10000; --connections at most 20000; --rounds at most 50")
    return args


def main(argv=None):
    args = parse_args(argv)

    exit_on_sigterm()

    binary = shutil.which("espeak-ng")
    if binary is None:
        sys.exit("espeak-ng is not installed (make system-deps)")
    nginx_missing = None
    if args.only in (None, "nginx"):
        try:
            devnginx.nginx_binary()
        except devnginx.NginxError as exc:
            if args.only == "nginx":
                sys.exit(str(exc))
            nginx_missing = str(exc)
    ncpu = os.cpu_count()
    soft, hard = raise_nofile()
    root = Path(tempfile.mkdtemp(prefix="bench-audio-", dir=args.tmp_dir))
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    print(run_header("audio service benchmark", args.quick))
    print(
        f"engine: {binary} ({version.split('  ')[0]}); MP3: lameenc quality {mp3_quality() or '?'} at "
        f"{mp3.BIT_RATE_KBPS} kb/s (app/audio/mp3.py); temporary DATA_DIRs under {root}"
    )
    print(
        f"bench client: gevent, raw sockets, RLIMIT_NOFILE {soft}/{hard}; it runs on the same {ncpu} CPUs "
        f"as the service"
    )
    engine = speech = ready = proxied = None
    steal0, t_run = machine_busy_seconds()[1], time.perf_counter()
    try:
        if args.only in (None, "speech"):
            engine = run_engine_alone(args, binary)
            print_engine(engine, ncpu)
            speech = run_speech(args, root, binary)
            print_speech(speech, engine, ncpu)
        if args.only in (None, "ready"):
            ready = run_flood(args, root, binary)
            print_flood(ready, ncpu)
        if args.only in (None, "nginx"):
            if nginx_missing:
                print(f"\n== /ready flood through nginx: SKIPPED: {nginx_missing} ==", flush=True)
            else:
                proxied = run_flood(args, root, binary, through_nginx=True)
                print_flood(proxied, ncpu)
    finally:
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    steal, t_run = machine_busy_seconds()[1] - steal0, time.perf_counter() - t_run
    print(f"\n== Summary ({'quick smoke run' if args.quick else 'full run'}) ==")
    print(
        f"   CPU stolen by the hypervisor over the whole run: {steal:.2f} s in {t_run:.0f} s "
        f"({steal / t_run * 100 / ncpu:.1f}% of the {ncpu} CPUs)"
    )
    disturbed = []
    if engine and engine["other"] > DISTURBED:
        disturbed.append(f"espeak-ng alone {engine['other'] * 100:.0f}%")
    if speech and speech["cpu"].other / speech["cpu"].seconds > DISTURBED:
        disturbed.append(f"speech {speech['cpu'].other / speech['cpu'].seconds * 100:.0f}%")
    for what, flood in (("/ready", ready), ("/ready via nginx", proxied)):
        for i, x in enumerate(flood["rounds"] if flood else (), 1):
            if x["cpu"].other / x["cpu"].seconds > DISTURBED:
                disturbed.append(f"{what} round {i} {x['cpu'].other / x['cpu'].seconds * 100:.0f}%")
    if disturbed:
        print(
            f"   WARNING: other processes on this machine used a good share of a CPU during: "
            f"{', '.join(disturbed)} (of one CPU): those figures are disturbed; run again on a quiet machine"
        )
    rows = []
    if speech:
        all_ok = not speech["others"] and not speech["errors"] and speech["ok"] > 0
        rows.append(
            (
                f"speech requests/s ({args.clients} clients)",
                f"{speech['rate']:.1f}/s, p50 {fmt_ms(speech['p50'])}, p99 {fmt_ms(speech['p99'])}; "
                f"engine alone {engine['par_rate']:.1f}/s -> ratio {speech.get('ratio') or 0:.2f}",
                "(figure only)",
                None,
            )
        )
        rows.append(
            (
                "speech answers",
                f"{speech['ok']} x 200 audio/mpeg, others {speech['others'] or 0}, "
                f"errors {sum(speech['errors'].values())}",
                "all 200 audio/mpeg",
                all_ok,
            )
        )
    goal_p99 = f"<= {TARGET_READY_P99_S * 1000:.0f} ms, all 200"
    goal_probes = "1 at start-up, 0 inside, 1 after"
    verdicts = []
    if ready:
        worst = worst_p99(ready)
        ok = worst is not None and worst <= TARGET_READY_P99_S and all_answered(ready)
        rows.append(
            (
                f"/ready p99 direct ({ready['connections']} at once)",
                f"worst round {fmt_ms(worst)} ("
                + ", ".join(fmt_ms(x["p99"]) for x in ready["rounds"])
                + "); p50 "
                + ", ".join(fmt_ms(x["p50"]) for x in ready["rounds"])
                + f"; all 200: {'yes' if all_answered(ready) else 'NO'}",
                goal_p99,
                ok,
            )
        )
        rows.append(
            (
                "probes, direct",
                fmt_probes(ready) + f" (interval {ready['interval']:g} s)",
                goal_probes,
                probes_ok(ready),
            )
        )
        verdicts.append(
            f"TARGET /ready p99 <= {TARGET_READY_P99_S * 1000:.0f} ms with {ready['connections']} "
            f"concurrent calls, straight to gunicorn (ONE gevent worker on this shared {ncpu}-core "
            f"machine, the bench client on the same cores): {verdict(ok)} (worst round {fmt_ms(worst)})"
            + ("" if ready["connections"] >= TARGET_READY_CONNECTIONS else " (fewer calls than the target)")
        )
    if proxied:
        worst = worst_p99(proxied)
        ok = worst is not None and worst <= TARGET_READY_P99_S and all_answered(proxied)
        cached = worst_p99(proxied, proxied["rounds"][1:])
        cached_ok = cached is not None and cached <= TARGET_READY_P99_S and all_answered(proxied)
        rows.append(
            (
                f"/ready p99 via nginx ({proxied['connections']} at once)",
                f"worst round {fmt_ms(worst)} ("
                + ", ".join(fmt_ms(x["p99"]) for x in proxied["rounds"])
                + "); p50 "
                + ", ".join(fmt_ms(x["p50"]) for x in proxied["rounds"])
                + f"; all 200: {'yes' if all_answered(proxied) else 'NO'}",
                goal_p99,
                ok,
            )
        )
        if cached is not None:
            rows.append(
                (
                    "  rounds 2.. (entry in nginx's cache)",
                    f"worst round {fmt_ms(cached)} (round 1 found the cache empty)",
                    goal_p99,
                    cached_ok,
                )
            )
        rows.append(
            (
                "via nginx: X-Cache-Status",
                "; ".join(
                    f"r{i} " + ", ".join(f"{n} {c}" for n, c in x["cache"].most_common())
                    for i, x in enumerate(proxied["rounds"], 1)
                ),
                "(figure only)",
                None,
            )
        )
        rows.append(
            (
                "via nginx: reached the service",
                ", ".join(str(x["server_n"]) for x in proxied["rounds"]) + " /ready requests per round",
                "(figure only)",
                None,
            )
        )
        rows.append(
            (
                "probes, via nginx",
                fmt_probes(proxied) + f" (interval {proxied['interval']:g} s)",
                goal_probes,
                probes_ok(proxied),
            )
        )
        verdicts.append(
            f"TARGET /ready p99 <= {TARGET_READY_P99_S * 1000:.0f} ms with {proxied['connections']} "
            f"concurrent calls through nginx (how users reach it): {verdict(ok)} (worst round "
            f"{fmt_ms(worst)}; round 1, on nginx's empty cache: {fmt_ms(proxied['rounds'][0]['p99'])}"
            + (
                f"; later rounds, entry cached (fresh or stale): {fmt_ms(cached)}, {verdict(cached_ok)}"
                if cached is not None
                else ""
            )
            + ")"
        )
    print_targets(rows)
    for line in verdicts:
        print(line)
    floods = [(what, f) for what, f in (("straight to gunicorn", ready), ("through nginx", proxied)) if f]
    if floods:
        print(
            "TARGET exactly one provider probe per probe interval: "
            + "; ".join(f"{what} {verdict(probes_ok(f))}" for what, f in floods)
        )
    if args.only in (None, "nginx") and nginx_missing:
        print(f"(the flood through nginx did not run: {nginx_missing})")


if __name__ == "__main__":
    main()
