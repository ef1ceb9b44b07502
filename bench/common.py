"""What the service benchmarks (bench.decks, bench.audio, bench.workspace) share:
figures (percentiles, CPU meters read from /proc), a minimal HTTP/1.1 client, the
service under test started with devtools.services.start, and run-level chores.

The benches call gevent's monkey.patch_all() before they import this module, so
everything here (sockets, sleeps) is cooperative; nothing here patches or needs
to be imported before the patch.
"""

import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import gevent

from devtools import nginx as devnginx
from devtools import services

HOST = "127.0.0.1"  # the benches talk to this machine only
CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc/<pid>/stat and /proc/stat count in these ticks

# Bounds shared by every bench.
REQUEST_TIMEOUT_S = 30.0  # one HTTP request
STOP_TIMEOUT_S = 20.0  # systemd's stop time-out
NGINX_STOP_TIMEOUT_S = 10.0
WORKER_START_TIMEOUT_S = 10.0  # gunicorn forking its workers

# Other processes using more than this share of one CPU during a measurement disturb it.
DISTURBED = 0.15


# --------------------------------------------------------------------------- figures


def percentile(values, p):
    """Nearest-rank percentile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def verdict(ok):
    return "met" if ok else "NOT MET"


def print_targets(rows):
    """The summary table: rows of (target, measured, goal, ok); ok None = a figure
    without a verdict."""
    if not rows:
        return
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"   {'target':<{width[0]}}  {'measured':<{width[1]}}  {'goal':<{width[2]}}  result")
    for name, measured, goal, ok in rows:
        print(
            f"   {name:<{width[0]}}  {measured:<{width[1]}}  {goal:<{width[2]}}  {'-' if ok is None else verdict(ok)}"
        )


# --------------------------------------------------------------------------- CPU from /proc


def proc_cpu(pid):
    """(own utime+stime of all its threads, waited-for children's cutime+cstime) of
    a process, in seconds, or None when it is gone. A worker that waits for the
    processes it starts (espeak-ng) has their CPU in the second figure."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
    except OSError:
        return None
    return ((int(fields[11]) + int(fields[12])) / CLK_TCK, (int(fields[13]) + int(fields[14])) / CLK_TCK)


def proc_cpu_seconds(pid):
    """A process's own CPU seconds (None when it is gone)."""
    cpu = proc_cpu(pid)
    return None if cpu is None else cpu[0]


def proc_status_kb(pid, field):
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def self_cpu_seconds():
    """This process's CPU: the bench client shares the machine with the service."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_seconds():
    """(CPU-seconds all CPUs of the machine spent busy, of which stolen by the
    hypervisor) since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    steal = values[7] if len(values) > 7 else 0
    return (sum(values[:8]) - idle) / CLK_TCK, steal / CLK_TCK


def child_pids(pid):
    """A process's direct children (nginx's master -> its workers and cache processes)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class CpuMeter:
    """CPU used between start() and stop(): the workers (all their threads), the
    processes they started and waited for (`engines`), the proxy's processes (nginx)
    if any, this client, the rest of the machine (`other`), and the time the
    hypervisor stole (a virtual machine's neighbours slow every figure down)."""

    def __init__(self, worker_pids, proxy_pids=()):
        self.worker_pids, self.proxy_pids = tuple(worker_pids), tuple(proxy_pids)

    def _workers(self):
        """(own, children's) CPU of the workers; a worker gone counts nothing."""
        cpus = [proc_cpu(pid) or (0.0, 0.0) for pid in self.worker_pids]
        return sum(c[0] for c in cpus), sum(c[1] for c in cpus)

    def _proxy(self):
        return sum(proc_cpu_seconds(pid) or 0.0 for pid in self.proxy_pids)

    def start(self):
        self.w0, self.p0 = self._workers(), self._proxy()
        self.c0, self.b0, self.t0 = self_cpu_seconds(), machine_busy_seconds(), time.perf_counter()
        return self

    def stop(self):
        self.seconds = time.perf_counter() - self.t0
        w1 = self._workers()
        self.worker = max(0.0, w1[0] - self.w0[0])
        self.engines = max(0.0, w1[1] - self.w0[1])
        self.proxy = max(0.0, self._proxy() - self.p0)
        self.client = self_cpu_seconds() - self.c0
        busy, steal = machine_busy_seconds()
        self.steal = steal - self.b0[1]
        self.other = max(0.0, busy - self.b0[0] - self.steal - self.worker - self.engines - self.proxy - self.client)
        return self

    def pct(self, value):
        """`value` CPU-seconds as a share of one CPU over the metered time."""
        return f"{value / self.seconds * 100:.0f}%" if self.seconds > 0 else "-"

    def disturbed(self):
        return self.seconds > 0 and (self.other + self.steal) / self.seconds > DISTURBED


# --------------------------------------------------------------------------- HTTP client


class HttpError(Exception):
    pass


def build_request(method, path, host, headers=None, body=None):
    """The bytes of one HTTP/1.1 request (build once, send many times when the
    client's own CPU matters). `body`: None, bytes sent as they are, or a JSON-able
    object (sent as application/json)."""
    if body is None or isinstance(body, bytes):
        payload = body or b""
    else:
        payload = json.dumps(body, separators=(",", ":")).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    if body is not None and not isinstance(body, bytes):
        head += "Content-Type: application/json\r\n"
    if payload or method in ("POST", "PUT", "PATCH"):
        head += f"Content-Length: {len(payload)}\r\n"
    return head.encode("latin-1") + b"\r\n" + payload


class NoAnswer(ConnectionError):
    """The connection ended (closed or reset) before any byte of the response."""


def read_response(sock, buf, what):
    """(status, headers, body, rest of buf) of one HTTP/1.1 response with a
    Content-Length (Flask's, and nginx's passing them on, have one), read from
    `sock` after the bytes already in `buf`."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        try:
            data = sock.recv(65536)
        except ConnectionResetError as exc:
            if not buf:
                raise NoAnswer(f"{what}: the server reset the connection") from exc
            raise
        if not data:
            raise (ConnectionError if buf else NoAnswer)(f"{what}: the server closed the connection")
        buf += data
    lines = buf[:end].decode("latin-1").split("\r\n")
    buf = buf[end + 4 :]
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" not in headers:
        raise HttpError(f"{what}: response without Content-Length ({headers})")
    length = int(headers["content-length"])
    while len(buf) < length:
        data = sock.recv(max(65536, length - len(buf)))
        if not data:
            raise ConnectionError(f"{what}: the server closed the connection mid-body")
        buf += data
    return status, headers, buf[:length], buf[length:]


def timed_answers(client, send, deadline, latencies, errors, max_requests=1_000_000, max_reconnects=20):
    """Answers of `send()` (a request on `client`) repeated until the perf_counter
    `deadline` or `max_requests`, each one's latency appended to `latencies`. A
    transport error is counted in `errors` and the loop goes on, until the client
    has reconnected more than `max_reconnects` times (bounded reconnects)."""
    for _ in range(max_requests):
        if time.perf_counter() >= deadline:
            return
        t0 = time.perf_counter()
        try:
            answer = send()
        except (OSError, ConnectionError, HttpError, ValueError) as exc:
            errors[f"{type(exc).__name__}: {exc}"] += 1
            if client.connects > max_reconnects:
                return
            continue
        latencies.append(time.perf_counter() - t0)
        yield answer


class KeepAliveClient:
    """A minimal HTTP/1.1 client on one keep-alive connection (much cheaper per
    request than http.client, which matters when the client shares the CPUs with
    the service). `host` is the Host header (nginx routes on it); by default the
    address connected to."""

    # gunicorn closes keep-alive connections idle for `keepalive` (2) seconds;
    # reconnect rather than reuse one idle for longer than this.
    MAX_IDLE_S = 1.0

    def __init__(self, port, host=None, timeout=REQUEST_TIMEOUT_S, resend_stale=False):
        self.port, self.timeout, self.resend_stale = port, timeout, resend_stale
        self.host = host or f"{HOST}:{port}"
        self.sock, self.buf = None, b""
        self.connects = 0
        self.last_used = 0.0

    def connect(self):
        self.close()
        self.sock = socket.create_connection((HOST, self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.connects += 1
        self.last_used = time.monotonic()

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def send(self, raw):
        """Send prepared request bytes (build_request); (status, headers, body bytes).
        With `resend_stale`, a GET on a kept-alive connection that the server closed
        meanwhile (a stopping worker closes its idle ones) is sent again on a new one,
        once, as browsers, urllib3 and nginx's upstream keep-alive do."""
        reused = self._reusable()
        try:
            return self._send(raw)
        except (NoAnswer, BrokenPipeError):
            if not (self.resend_stale and reused and raw.startswith(b"GET ")):
                raise
            return self._send(raw)

    def _reusable(self):
        """Whether the next request goes on the connection kept from the last one."""
        return self.sock is not None and time.monotonic() - self.last_used <= self.MAX_IDLE_S

    def _send(self, raw):
        if not self._reusable():
            self.connect()
        try:
            self.sock.sendall(raw)
            what = raw.split(b" HTTP/", 1)[0].decode("latin-1")  # "METHOD path", for errors
            status, headers, content, self.buf = read_response(self.sock, self.buf, what)
            if headers.get("connection", "").lower() == "close":
                self.close()
            self.last_used = time.monotonic()
            return status, headers, content
        except BaseException:
            self.close()  # the connection's state is unknown: never reuse it
            raise

    def request(self, method, path, body=None, headers=None):
        """(status, headers, body bytes); `body` as build_request takes it."""
        return self.send(build_request(method, path, self.host, headers, body))

    def json(self, method, path, body=None, headers=None, expect=(200, 201)):
        """The decoded JSON answer; HttpError when the status is not in `expect`."""
        status, _, content = self.request(method, path, body, headers)
        if status not in expect:
            raise HttpError(f"{method} {path} -> {status}: {content[:300]!r}")
        return json.loads(content)


# --------------------------------------------------------------------------- the service under test


class Service:
    """devtools.services.start with its output in a log file (read back for the
    service's own request times and shown when a bench fails); stop() is idempotent."""

    def __init__(self, name, data_dir, log_path, workers=1, env=None):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.running = None
        self.stop_seconds = None
        try:
            self.running = services.start(
                name, data_dir, env=env, workers=workers, stdout=self.log, stderr=subprocess.STDOUT
            )
        except BaseException:
            self.log.close()
            raise
        self.port = self.running.port
        try:
            # The arbiter forks its workers right away; wait (bounded) until all are there.
            deadline = time.monotonic() + WORKER_START_TIMEOUT_S
            while len(self.running.worker_pids()) < workers and time.monotonic() < deadline:
                gevent.sleep(0.05)
            self.worker_pids = self.running.worker_pids()
            if not self.worker_pids:
                raise RuntimeError("the service has no worker process")
        except BaseException:
            self.stop()
            raise

    @property
    def worker_pid(self):
        """The first worker (the only one unless --workers)."""
        return self.worker_pids[0]

    def stop(self):
        """Seconds the service took to stop (inf: it was killed); None when already stopped."""
        if self.running is None:
            return None
        running, self.running = self.running, None
        try:
            self.stop_seconds = running.stop(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop_seconds = float("inf")  # it was killed
        finally:
            self.log.close()
        return self.stop_seconds

    def log_tail(self, lines=25):
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_nginx(prefix, site, service):
    """A real nginx in front of `service` (the production site template for
    `site`); returns (proxy, its pids: master, workers, cache processes)."""
    proxy = devnginx.start(prefix, None, {site: f"{HOST}:{service.port}"})
    return proxy, [proxy.process.pid, *child_pids(proxy.process.pid)]


def stop_nginx(proxy):
    """Stop nginx (bounded); a failure is reported, not raised, so that the service
    is stopped after it whatever happens."""
    try:
        proxy.stop(timeout=NGINX_STOP_TIMEOUT_S)
    except devnginx.NginxError as exc:
        print(f"   warning: {exc}", file=sys.stderr)


def log_tails(service, proxy=None):
    """What to show when a phase fails: the end of the service's log and nginx's stderr."""
    text = "   --- service log tail ---\n" + service.log_tail()
    if proxy is not None and proxy.stderr_text():
        text += "\n   --- nginx stderr ---\n" + proxy.stderr_text()[-3000:]
    return text


# --------------------------------------------------------------------------- the run


def exit_on_sigterm():
    """SIGTERM raises SystemExit, which unwinds through the finally blocks that stop
    nginx and the service (the default action would leave them running)."""

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def raise_nofile(wanted=None):
    """Raise this process's open-file limit (one socket per stream or connection) to
    `wanted` where it may (root with CAP_SYS_RESOURCE may raise the hard limit too),
    else to its hard limit; returns (soft, hard). Child processes inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if wanted is not None and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ValueError, OSError):
            pass  # not allowed here: the hard limit it is
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def run_header(what, quick):
    """The first line of a bench's report: what, when, on what."""
    return (
        f"{what} ({'quick' if quick else 'full'} run), {time.strftime('%Y-%m-%d %H:%M:%S')}, "
        f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, gevent {gevent.__version__}"
    )


def merge_rounds(segments):
    """One route's rounds (each {count, seconds, rate, latencies, statuses, errors, bad,
    cpu: CpuMeter, stragglers}) as one figure: rate, latency percentiles, answers,
    CPU per request and share of one CPU per process, and which rounds were disturbed."""
    seconds = sum(s["seconds"] for s in segments)
    count = sum(s["count"] for s in segments)
    latencies = [x for s in segments for x in s["latencies"]]
    statuses, errors, bad = Counter(), Counter(), Counter()
    for s in segments:
        statuses.update(s["statuses"])
        errors.update(s["errors"])
        bad.update(s.get("bad", {}))
    cpu = {
        part: sum(getattr(s["cpu"], part) for s in segments) for part in ("worker", "proxy", "client", "other", "steal")
    }
    figure = {
        "count": count,
        "seconds": seconds,
        "rate": count / seconds if seconds else 0.0,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies) if latencies else None,
        "mean": sum(latencies) / len(latencies) if latencies else None,
        "statuses": statuses,
        "errors": errors,
        "bad": bad,
        "all_ok": count > 0 and set(statuses) == {200} and not errors and not bad,
        "rates": [s["rate"] for s in segments],
        "disturbed_rounds": [i + 1 for i, s in enumerate(segments) if s["cpu"].disturbed()],
        "stragglers": sum(s["stragglers"] for s in segments),
    }
    for part in ("worker", "proxy", "client"):
        figure[f"{part}_per_req"] = cpu[part] / count if count else None
    for part, used in cpu.items():
        figure[f"{part}_share"] = used / seconds if seconds else 0.0
    return figure


class ChunkedBody:
    """HTTP/1.1 chunked transfer decoding of a body that arrives in pieces: feed() returns
    the body bytes the new data completes; `ended` once the last (empty) chunk came."""

    __slots__ = ("raw", "state", "need", "ended")

    def __init__(self):
        self.raw, self.state, self.need, self.ended = b"", "size", 0, False

    def feed(self, data):
        raw, pos, body = self.raw + data, 0, []
        while True:
            if self.state == "size":
                at = raw.find(b"\r\n", pos)
                if at < 0:
                    break
                size = int(raw[pos:at].split(b";", 1)[0], 16)
                pos = at + 2
                if size == 0:
                    self.ended = True
                    break
                self.need, self.state = size, "data"
            elif self.state == "data":
                take = min(self.need, len(raw) - pos)
                if take <= 0:
                    break
                body.append(raw[pos : pos + take])
                pos += take
                self.need -= take
                if self.need == 0:
                    self.state = "crlf"
            else:  # the CRLF after a chunk's data
                if len(raw) - pos < 2:
                    break
                pos += 2
                self.state = "size"
        self.raw = raw[pos:]
        return b"".join(body)
