"""The workspace agent program: runs inside a workspace, holds one websocket to the
platform and serves the streams the platform opens on it (mux.py's protocol).

    python -m app.workspace.agent --url <WORKSPACE_ACCESS_URL> --token <agent token> \\
        [--app slug=http://127.0.0.1:8080 ...]

(or the environment variables WORKSPACE_ACCESS_URL and WORKSPACE_AGENT_TOKEN; the
token is better given that way than on a command line others can read.)

- It reports its `--app`s in its HELLO; the platform records them on the agent.
- App streams: it dials the app's address and splices raw bytes both ways (HTTP,
  streaming bodies and websocket upgrades alike).
- Terminal streams: a real PTY running the user's shell ($SHELL, else /bin/sh) as a
  login shell. A shell outlives its browser tab: reopening a stream with the same
  reconnect id within --pty-keep-seconds (5 minutes) re-attaches to it and first
  replays its last 64 KiB of output.
- When the connection ends (the platform restarts, the network fails, nothing
  arrives for three ping intervals) it reconnects, waiting 0.5 s doubling to 10 s
  with jitter between attempts. Shells survive reconnections. A platform that does
  not answer the HELLO (one that speaks another protocol version closes with the
  reason, which is logged) does not reset the backoff.
"""
from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import fcntl  # noqa: E402
import ipaddress  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import termios  # noqa: E402
import time  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import gevent  # noqa: E402
import gevent.os  # noqa: E402
from gevent.lock import Semaphore  # noqa: E402
from app.workspace.mux import MAX_DATA, VERSION_REFUSED, Mux, StreamClosed, splice, version_mismatch  # noqa: E402
from app.workspace.websocket import HandshakeRefused, connect_frames  # noqa: E402

RPC_PATH = "/api/v2/workspaceagents/me/rpc"
TOKEN_HEADER = "Workspace-Session-Token"
BACKOFF_START_S, BACKOFF_CAP_S = 0.5, 10.0
DIAL_TIMEOUT_S = 10.0
REPLAY_BYTES = 64 * 1024
READ_BYTES = 64 * 1024

log = logging.getLogger("workspace-agent")


# --------------------------------------------------------------------------- terminals

def set_window_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _new_session_on_the_pty():
    # In the child, its stdin already the PTY: a session of its own whose controlling
    # terminal is the PTY (job control, ^C, SIGHUP when the PTY closes).
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtySession:
    """A shell on a PTY, attached to at most one stream at a time."""

    def __init__(self, key, rows, cols, on_end):
        self.key, self.on_end = key, on_end
        master, slave = os.openpty()
        set_window_size(master, rows, cols)
        shell = os.environ.get("SHELL") or "/bin/sh"
        self.process = subprocess.Popen(
            [shell, "-l"], stdin=slave, stdout=slave, stderr=slave, close_fds=True,
            preexec_fn=_new_session_on_the_pty, cwd=os.path.expanduser("~"),
            env={**os.environ, "TERM": "xterm-256color"})
        os.close(slave)
        gevent.os.make_nonblocking(master)
        self.fd = master
        self.replay = bytearray()
        self.stream = None
        self.detached_at = time.monotonic()
        self._writing = Semaphore()  # the replay and live output reach a stream in order
        self.output = gevent.spawn(self._pump_output)

    def _pump_output(self):
        while True:
            try:
                data = gevent.os.nb_read(self.fd, READ_BYTES)
            except OSError:
                data = b""  # EIO: the shell and its children are gone
            if not data:
                break
            self.replay += data
            del self.replay[:-REPLAY_BYTES]
            self._send(data)
        self._ended()

    def _send(self, data):
        with self._writing:
            stream = self.stream
            if stream is not None:
                try:
                    stream.write(data)
                except StreamClosed:
                    self._detach(stream)

    def _ended(self):
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.write_eof()
            stream.close("the shell exited")
        self.kill()
        self.on_end(self)

    def attach(self, stream, rows, cols):
        """Serve `stream` until it ends: replay, then live output down, input up."""
        previous = self.stream
        if previous is not None:
            previous.close("another terminal attached to this session")
        with self._writing:
            self.stream = stream
            stream.on_resize = self.resize
            self.resize(rows, cols)
            if self.replay:
                stream.write(bytes(self.replay))
        try:
            while True:
                data = stream.read()
                if not data:
                    break
                self._write_input(data)
        finally:
            self._detach(stream)

    def _write_input(self, data):
        view = memoryview(data)
        while view:
            view = view[gevent.os.nb_write(self.fd, view):]

    def _detach(self, stream):
        if self.stream is stream:
            self.stream = None
            self.detached_at = time.monotonic()

    def resize(self, rows, cols):
        try:
            set_window_size(self.fd, max(1, min(rows, 1000)), max(1, min(cols, 1000)))
        except OSError:
            pass

    def kill(self):
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGHUP)
            except OSError:
                pass
        gevent.spawn(self._reap)

    def _reap(self):
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        try:
            os.close(self.fd)
        except OSError:
            pass


class Terminals:
    """The agent's shells by reconnect id; a detached one is ended after `keep_seconds`."""

    def __init__(self, keep_seconds):
        self.keep_seconds = keep_seconds
        self.sessions = {}

    def serve(self, stream):
        meta = stream.meta
        key = str(meta.get("reconnect") or "")[:64] or os.urandom(8).hex()
        rows, cols = int(meta.get("rows") or 24), int(meta.get("cols") or 80)
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = PtySession(key, rows, cols, self._forget)
        session.attach(stream, rows, cols)

    def _forget(self, session):
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]

    def reap_detached(self):
        while True:
            gevent.sleep(min(10.0, self.keep_seconds))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.stream is None and now - session.detached_at > self.keep_seconds:
                    log.info("ending terminal session %s: detached for %.0f s", session.key, now - session.detached_at)
                    self._forget(session)
                    session.kill()

    def kill_all(self):
        for session in list(self.sessions.values()):
            session.kill()


# --------------------------------------------------------------------------- apps

def dial(host, port):
    """A connected TCP socket. An address literal (the usual 127.0.0.1) is dialed
    directly: gevent resolves names in its threadpool, a thread round trip per
    stream that costs more than the rest of a small request on the agent."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.create_connection((host, port), timeout=DIAL_TIMEOUT_S)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(DIAL_TIMEOUT_S)
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def serve_app(stream):
    target = urlsplit(str(stream.meta.get("url") or ""))
    if target.scheme != "http" or not target.hostname:
        stream.close(f"not an http app address: {stream.meta.get('url')!r}")
        return
    try:
        sock = dial(target.hostname, target.port or 80)
    except OSError as exc:
        stream.close(f"could not connect to the app at {target.netloc}: {exc}")
        return
    with sock:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        splice(stream, sock)


# --------------------------------------------------------------------------- the connection

class Agent:
    def __init__(self, access_url, token, apps, keep_seconds):
        parts = urlsplit(access_url.rstrip("/"))
        scheme = "wss" if parts.scheme == "https" else "ws"
        self.rpc_url = f"{scheme}://{parts.netloc}{parts.path}{RPC_PATH}"
        self.token, self.apps = token, apps
        self.terminals = Terminals(keep_seconds)
        self.mux = None

    def on_open(self, stream):
        kind = stream.meta.get("kind")
        if kind == "app":
            serve_app(stream)
        elif kind == "pty":
            self.terminals.serve(stream)
        else:
            stream.close(f"unknown stream kind {kind!r}")

    def connect_once(self):
        """One connection, served until it ends. False when it could not be made or
        the platform did not accept it (no HELLO answer: the backoff goes on)."""
        try:
            transport = connect_frames(self.rpc_url, {TOKEN_HEADER: self.token}, timeout=DIAL_TIMEOUT_S,
                                       max_message_size=MAX_DATA + 64 * 1024)
        except HandshakeRefused as exc:
            log.warning("the platform refused the connection (HTTP %s)%s", exc.status_code,
                        ": is the agent token valid?" if exc.status_code == 401 else "")
            return False
        except OSError as exc:
            log.warning("could not reach the platform at %s: %s", self.rpc_url, exc)
            return False
        watcher = []

        def on_hello(info):
            refused = version_mismatch(info, "platform", "agent")
            if refused is not None:
                self.mux.close(refused, VERSION_REFUSED)
                return
            ping = info.get("ping_seconds") if isinstance(info.get("ping_seconds"), int) else 15
            watcher.append(gevent.spawn(self.mux.watch_silence, 3 * max(1, ping)))

        self.mux = Mux(transport, opens=False, on_open=self.on_open, on_hello=on_hello)
        self.mux.hello({"apps": [{"slug": slug, "url": url} for slug, url in self.apps.items()],
                        "hostname": socket.gethostname()})
        log.info("connected to %s", self.rpc_url)
        reason = self.mux.run()
        gevent.killall(watcher)
        if not watcher:  # the platform never answered the HELLO: it refused this agent
            log.error("the platform did not accept this agent: %s", reason)
            return False
        log.info("disconnected: %s", reason)
        return True

    def run_forever(self):
        gevent.spawn(self.terminals.reap_detached)
        delay = BACKOFF_START_S
        while True:
            if self.connect_once():
                delay = BACKOFF_START_S
            gevent.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, BACKOFF_CAP_S)

    def stop(self):
        self.terminals.kill_all()
        if self.mux is not None:
            self.mux.close("the agent is stopping")


def parse_apps(values):
    apps = {}
    for value in values:
        slug, sep, url = value.partition("=")
        if not sep or not slug or not url.startswith("http://"):
            raise SystemExit(f"--app {value!r}: expected slug=http://host:port")
        apps[slug] = url.rstrip("/")
    return apps


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m app.workspace.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("WORKSPACE_ACCESS_URL"),
                        help="the platform's address (WORKSPACE_ACCESS_URL)")
    parser.add_argument("--token", default=os.environ.get("WORKSPACE_AGENT_TOKEN"),
                        help="the agent token (WORKSPACE_AGENT_TOKEN; preferred: not visible in ps)")
    parser.add_argument("--app", action="append", default=[], metavar="SLUG=URL",
                        help="an app inside the workspace, e.g. code=http://127.0.0.1:8080 (repeatable)")
    parser.add_argument("--pty-keep-seconds", type=float, default=300.0,
                        help="how long a detached terminal's shell is kept for a reconnect (default 300)")
    args = parser.parse_args(argv)
    if not args.url or not args.token:
        parser.error("--url and --token (or WORKSPACE_ACCESS_URL and WORKSPACE_AGENT_TOKEN) are required")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    agent = Agent(args.url, args.token, parse_apps(args.app), args.pty_keep_seconds)

    def stop():
        agent.stop()
        gevent.sleep(0.2)  # let the shells get their SIGHUP
        os._exit(0)

    gevent.signal_handler(signal.SIGTERM, lambda: gevent.spawn(stop))
    gevent.signal_handler(signal.SIGINT, lambda: gevent.spawn(stop))
    agent.run_forever()


if __name__ == "__main__":
    main()
