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
  arrives for two ping intervals and a second: a platform host powered off) it
  reconnects, waiting 0.5 s doubling to 10 s with jitter between attempts. Shells
  survive reconnections. A platform that does not answer the HELLO (one that speaks
  another protocol version closes with the reason, which is logged) does not reset
  the backoff.
- Relay sessions: when the platform invites it (a RELAY frame: a client waits on the
  platform's /relay for this agent), it dials /relay?role=agent&agent=<its id>&session=<id>
  with its token and serves the same protocol there, the client opening the streams:
  app streams by slug (the apps the invitation lists, its own --app entries winning),
  and terminals (the same shells as the web terminal's, by reconnect id).
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
import uuid  # noqa: E402
from urllib.parse import urlencode, urlsplit  # noqa: E402

import gevent  # noqa: E402
import gevent.os  # noqa: E402
from gevent.lock import Semaphore  # noqa: E402

from app.workspace.mux import (  # noqa: E402
    MAX_DATA,
    VERSION_REFUSED,
    Mux,
    StreamClosed,
    relay_mux,
    splice,
    version_mismatch,
)
from app.workspace.websocket import HandshakeRefused, connect_frames  # noqa: E402

RPC_PATH = "/api/v2/workspaceagents/me/rpc"
RELAY_PATH = "/relay"
TOKEN_HEADER = "Workspace-Session-Token"
MESSAGE_LIMIT = MAX_DATA + 64 * 1024  # a mux frame and its header; JSON frames are small
RELAY_SESSIONS = 32  # relay sessions served at once; more invitations are ignored
RELAY_HELLO_S = 30.0  # a relay peer that sends no HELLO within this is left
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
            self.resize(*(stream.unheard_size or (rows, cols)))  # resized while the shell started
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

def websocket_base(access_url):
    """ws(s)://host[:port][/prefix] of a platform's http(s) address."""
    parts = urlsplit(access_url.rstrip("/"))
    return f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}{parts.path}"


def relay_url(access_url, agent_id, role, session):
    return f"{websocket_base(access_url)}{RELAY_PATH}?" + urlencode(
        {"agent": agent_id, "role": role, "session": session})


class Agent:
    def __init__(self, access_url, token, apps, keep_seconds):
        self.access_url = access_url
        self.rpc_url = websocket_base(access_url) + RPC_PATH
        self.token, self.apps = token, apps
        self.terminals = Terminals(keep_seconds)
        self.mux = None
        self.agent_id = None  # the platform's HELLO tells it
        self.relays = set()  # the Mux of each relay session served

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
                                       max_message_size=MESSAGE_LIMIT)
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
            ping = info.get("ping_seconds") if isinstance(info.get("ping_seconds"), int) else 5
            self.agent_id = info.get("agent_id") if isinstance(info.get("agent_id"), str) else None
            # Two pings missed: the platform is gone (11 s at the default 5 s), and the
            # agent is on another host of it soon after.
            watcher.append(gevent.spawn(self.mux.watch_silence, 2 * max(1, ping) + 1))

        self.mux = Mux(transport, opens=False, on_open=self.on_open, on_hello=on_hello, on_relay=self.on_relay)
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

    # -- relay sessions
    def on_relay(self, info):
        """The platform's RELAY invitation (never blocks: the session is served apart)."""
        try:
            session = str(uuid.UUID(str(info.get("session"))))
        except ValueError:
            log.warning("a relay invitation without a valid session id was ignored")
            return
        if self.agent_id is None or len(self.relays) >= RELAY_SESSIONS:
            log.warning("relay session %s not joined: %s", session,
                        "the platform did not say this agent's id" if self.agent_id is None
                        else f"{RELAY_SESSIONS} relay sessions are open")
            return
        apps = {str(app.get("slug")): str(app.get("url")) for app in info.get("apps") or []
                if isinstance(app, dict)}
        gevent.spawn(self.serve_relay, session, {**apps, **self.apps})

    def serve_relay(self, session, apps):
        """Join relay `session` as its agent and serve the client's streams until it ends."""
        url = relay_url(self.access_url, self.agent_id, "agent", session)
        try:
            transport = connect_frames(url, {TOKEN_HEADER: self.token}, timeout=DIAL_TIMEOUT_S,
                                       max_message_size=MESSAGE_LIMIT)
        except (HandshakeRefused, OSError) as exc:
            log.warning("could not join relay session %s: %s", session,
                        f"HTTP {exc.status_code}" if isinstance(exc, HandshakeRefused) else exc)
            return
        mux = relay_mux(transport, opens=False, peer="client", me="agent",
                        on_open=lambda stream: self.on_relay_open(stream, apps),
                        hello={"hostname": socket.gethostname()})
        self.relays.add(mux)
        no_hello = gevent.spawn_later(RELAY_HELLO_S, lambda: mux.ready.is_set() or mux.close(
            f"the client sent no HELLO within {RELAY_HELLO_S:.0f} s"))
        log.info("joined relay session %s", session)
        try:
            reason = mux.run()
        finally:
            no_hello.kill()
            self.relays.discard(mux)
        log.info("relay session %s ended: %s", session, reason)

    def on_relay_open(self, stream, apps):
        """A relay client's stream: an app by slug (never a URL of the client's), or a pty."""
        if stream.meta.get("kind") == "app":
            slug = str(stream.meta.get("slug"))
            if slug not in apps:
                stream.close(f"this agent has no app {slug[:64]!r}")
                return
            stream.meta = {"kind": "app", "url": apps[slug]}
        self.on_open(stream)

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
        for mux in [self.mux, *self.relays]:
            if mux is not None:
                mux.close("the agent is stopping")


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
