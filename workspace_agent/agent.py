"""The workspace agent: runs inside a workspace, holds one websocket to the platform
and serves the streams the platform opens on it.

    python3 workspace-agent.pyz agent --url <the platform's address> [--app slug=http://127.0.0.1:8080 ...]

with the agent token in WORKSPACE_AGENT_TOKEN (never on a command line others can
read); the platform's init script (GET /api/v2/init-script) fetches this file and
runs it so.

- It reports its `--app`s in its HELLO; the platform records them on the agent.
- App streams: it dials the app's address and splices raw bytes both ways (HTTP,
  streaming bodies and websocket upgrades alike).
- Terminal streams: terminals.py.
- When the connection ends (the platform restarts, the network fails, nothing
  arrives for two ping intervals and a second: a platform host powered off) it
  reconnects, waiting 0.5 s doubling to 10 s with jitter between attempts. Shells
  survive reconnections.
- A platform that speaks another protocol version refuses the HELLO with the reason;
  the agent logs it and exits with status OUTDATED_EXIT (3), for its init script to fetch the
  platform's own agent and start that.
- Relay sessions: when the platform invites it (a RELAY frame: a client waits on the
  platform's /relay for this agent), it dials /relay?role=agent&agent=<its id>&session=<id>
  with its token and serves the same protocol there, the client opening the streams:
  app streams by slug (the apps the invitation lists, its own --app entries winning),
  and terminals (the same shells as the web terminal's, by reconnect id).
"""

import argparse
import asyncio
import ipaddress
import logging
import os
import random
import signal
import socket
import sys
import uuid
from urllib.parse import urlencode, urlsplit

import workspace_protocol.websocket as wire
from workspace_agent import version
from workspace_agent.connection import (
    DIAL_TIMEOUT_S,
    TOKEN_HEADER,
    UPGRADE_ANSWER_S,
    StreamClosed,
    connect,
    is_local_name,
    relay_link,
)
from workspace_agent.terminals import Terminals
from workspace_protocol.mux import MAX_DATA, OUTDATED_EXIT, TRY_AGAIN_LATER, VERSION_REFUSED, version_mismatch
from workspace_protocol.websocket import UNMASKED_HEADER, HandshakeRefused

RPC_PATH = "/api/v2/workspaceagents/me/rpc"
RELAY_PATH = "/relay"
RELAY_SESSIONS = 32  # relay sessions served at once; more invitations are ignored
RELAY_HELLO_S = 30.0  # a relay peer that sends no HELLO within this is left
BACKOFF_START_S, BACKOFF_CAP_S = 0.5, 10.0
# An app's answer read in pieces of at least this is framed in place (no copy); a
# smaller piece is copied into its frame (Stream.write), so that no transport keeps a
# large buffer for a few bytes.
IN_PLACE_BYTES = 64 * 1024

log = logging.getLogger("workspace-agent")


# --------------------------------------------------------------------------- apps


async def dial(host, port):
    """A non-blocking socket connected to an app (TCP_NODELAY). An address literal
    (the usual 127.0.0.1) is dialed without a name lookup, which asyncio would do in
    a thread."""
    loop = asyncio.get_running_loop()
    try:
        ipaddress.ip_address(host)
        addresses = [(socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port))]
    except ValueError:
        found = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), DIAL_TIMEOUT_S)
        addresses = [(family, address) for family, _, _, _, address in found]
    failure = OSError(f"no address for {host}")
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), DIAL_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            failure = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise failure


async def serve_app(stream):
    target = urlsplit(str(stream.meta.get("url") or ""))
    if target.scheme != "http" or not target.hostname:
        stream.close(f"not an http app address: {stream.meta.get('url')!r}")
        return
    try:
        sock = await dial(target.hostname, target.port or 80)
    except (OSError, asyncio.TimeoutError) as exc:
        stream.close(f"could not connect to the app at {target.netloc}: {exc or 'no answer'}")
        return
    try:
        await splice(stream, sock)
    finally:
        sock.close()


async def splice(stream, sock):
    """Copy bytes both ways between `stream` and an app's socket until both
    directions ended: each side's end of input is passed on as a half-close. What the
    app sends is received behind room for the frame's head and sent from there (no
    copy: a bulk answer costs the agent its two system calls)."""
    loop = asyncio.get_running_loop()

    async def app_to_stream():
        buffer = bytearray(wire.ROOM_BEFORE + MAX_DATA)
        try:
            while True:
                count = await loop.sock_recv_into(sock, memoryview(buffer)[wire.ROOM_BEFORE :])
                if not count:
                    break
                if count < IN_PLACE_BYTES:  # copied into its frame: the buffer stays ours
                    await stream.write(memoryview(buffer)[wire.ROOM_BEFORE : wire.ROOM_BEFORE + count])
                    continue
                await stream.write_in_place(buffer, wire.ROOM_BEFORE, count)
                if not stream.link.holds_nothing():
                    buffer = bytearray(len(buffer))  # the transport may still hold a view of this one
            stream.write_eof()
        except (OSError, StreamClosed):
            stream.close("the connection failed")

    upward = asyncio.ensure_future(app_to_stream())
    try:
        while True:
            data = await stream.read()
            if not data:
                break
            await loop.sock_sendall(sock, data)
        sock.shutdown(socket.SHUT_WR)  # the app sees the end of input, may still answer
        await upward
    except (OSError, StreamClosed):
        stream.close("the connection failed")
    finally:
        # Its pending receive must let go of the socket before the caller closes it: a
        # descriptor number reused by the next dial would meet a stale selector entry.
        upward.cancel()
        await asyncio.gather(upward, return_exceptions=True)


# --------------------------------------------------------------------------- the connection


def websocket_base(access_url):
    """ws(s)://host[:port][/prefix] of a platform's http(s) address."""
    parts = urlsplit(access_url.rstrip("/"))
    return f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}{parts.path}"


def relay_url(access_url, agent_id, role, session):
    return f"{websocket_base(access_url)}{RELAY_PATH}?" + urlencode(
        {"agent": agent_id, "role": role, "session": session}
    )


def unmasked_is_safe(url):
    """Ask for unmasked frames (workspace_protocol.websocket.UNMASKED_HEADER) where no
    proxy can read them: over TLS, or to a loopback address."""
    parts = urlsplit(url)
    if parts.scheme == "wss":
        return True
    try:
        return ipaddress.ip_address(parts.hostname or "").is_loopback
    except ValueError:
        return is_local_name(parts.hostname or "")


class Outdated(Exception):
    """The platform speaks another protocol version."""


class Agent:
    def __init__(self, access_url, token, apps, keep_seconds):
        self.access_url = access_url
        self.rpc_url = websocket_base(access_url) + RPC_PATH
        self.token, self.apps = token, apps
        self.terminals = Terminals(keep_seconds)
        self.link = None
        self.agent_id = None  # the platform's HELLO tells it
        self.relays = set()  # the Link of each relay session served
        self.retry_after = None  # seconds the platform asked for with its last refusal

    async def on_open(self, stream):
        kind = stream.meta.get("kind")
        if kind == "app":
            await serve_app(stream)
        elif kind == "pty":
            await self.terminals.serve(stream)
        else:
            stream.close(f"unknown stream kind {kind!r}")

    async def connect_once(self):
        """One connection, served until it ends. False when it could not be made or
        the platform did not accept it (no HELLO answer: the backoff goes on)."""
        answered = []

        def on_hello(link, info):
            refused = version_mismatch(info, "platform", "agent")
            if refused is not None:
                link.close(refused, VERSION_REFUSED)
                return
            ping = info.get("ping_seconds") if isinstance(info.get("ping_seconds"), int) else 5
            self.agent_id = info.get("agent_id") if isinstance(info.get("agent_id"), str) else None
            # Two pings missed: the platform is gone (11 s at the default 5 s), and the
            # agent is on another host of it soon after.
            answered.append(link.spawn(link.watch_silence(2 * max(1, ping) + 1)))

        headers = {TOKEN_HEADER: self.token, **(dict([UNMASKED_HEADER]) if unmasked_is_safe(self.rpc_url) else {})}
        try:
            self.link = await connect(
                self.rpc_url,
                headers,
                opens=False,
                on_open=self.on_open,
                on_hello=on_hello,
                on_relay=self.on_relay,
                answer_timeout=UPGRADE_ANSWER_S,
            )
        except HandshakeRefused as exc:
            self.retry_after = exc.retry_after
            log.warning(
                "the platform refused the connection (HTTP %s)%s",
                exc.status_code,
                ": is the agent token valid?" if exc.status_code == 401 else "",
            )
            return False
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("could not reach the platform at %s: %s", self.rpc_url, exc)
            return False
        try:
            self.link.hello(
                {
                    "apps": [{"slug": slug, "url": url} for slug, url in self.apps.items()],
                    "hostname": socket.gethostname(),
                    "agent_version": version(),
                }
            )
            log.info("connected to %s", self.rpc_url)
        except StreamClosed:
            pass  # closed with the upgrade's answer (a platform that cannot hold it now): the reason below
        reason = await self.link.closed
        if self.link.close_code == VERSION_REFUSED:
            raise Outdated(reason)
        if self.link.close_code == TRY_AGAIN_LATER:  # the platform is full or busy: back off, retry
            log.warning("the platform cannot hold this agent now (%s); retrying", reason)
            return False
        if not answered:  # the platform never answered the HELLO: it refused this agent
            log.error("the platform did not accept this agent: %s", reason)
            return False
        log.info("disconnected: %s", reason)
        return True

    # -- relay sessions
    def on_relay(self, info):
        """The platform's RELAY invitation (never waits: the session is served apart)."""
        try:
            session = str(uuid.UUID(str(info.get("session"))))
        except ValueError:
            log.warning("a relay invitation without a valid session id was ignored")
            return
        if self.agent_id is None or len(self.relays) >= RELAY_SESSIONS:
            log.warning(
                "relay session %s not joined: %s",
                session,
                "the platform did not say this agent's id"
                if self.agent_id is None
                else f"{RELAY_SESSIONS} relay sessions are open",
            )
            return
        apps = {str(app.get("slug")): str(app.get("url")) for app in info.get("apps") or [] if isinstance(app, dict)}
        self.link.spawn(self.serve_relay(session, {**apps, **self.apps}))

    async def serve_relay(self, session, apps):
        """Join relay `session` as its agent and serve the client's streams until it ends."""
        url = relay_url(self.access_url, self.agent_id, "agent", session)
        try:
            link = await relay_link(
                url,
                {TOKEN_HEADER: self.token},
                opens=False,
                peer="client",
                me="agent",
                on_open=lambda stream: self.on_relay_open(stream, apps),
                hello={"hostname": socket.gethostname()},
            )
        except (HandshakeRefused, OSError, asyncio.TimeoutError) as exc:
            log.warning(
                "could not join relay session %s: %s",
                session,
                f"HTTP {exc.status_code}" if isinstance(exc, HandshakeRefused) else exc,
            )
            return
        self.relays.add(link)
        log.info("joined relay session %s", session)
        try:
            await asyncio.wait_for(asyncio.shield(link.ready), RELAY_HELLO_S)
        except asyncio.TimeoutError:
            link.close(f"the client sent no HELLO within {RELAY_HELLO_S:.0f} s")
        try:
            reason = await link.closed
        finally:
            self.relays.discard(link)
        log.info("relay session %s ended: %s", session, reason)

    async def on_relay_open(self, stream, apps):
        """A relay client's stream: an app by slug (never a URL of the client's), or a pty."""
        if stream.meta.get("kind") == "app":
            slug = str(stream.meta.get("slug"))
            if slug not in apps:
                stream.close(f"this agent has no app {slug[:64]!r}")
                return
            stream.meta = {"kind": "app", "url": apps[slug]}
        await self.on_open(stream)

    async def run_forever(self):
        reaper = asyncio.ensure_future(self.terminals.reap_detached())
        delay = BACKOFF_START_S
        try:
            while True:
                try:
                    if await self.connect_once():
                        delay = BACKOFF_START_S
                except Outdated:
                    raise
                except Exception:  # a bug must not end the agent and its shells: log, back off, retry
                    log.exception("the connection failed")
                await asyncio.sleep(self._pause(delay))
                delay = min(delay * 2, BACKOFF_CAP_S)
        finally:
            reaper.cancel()

    def _pause(self, delay):
        """The wait before the next try: the backoff's step with jitter, and at least what
        a busy platform asked for (Retry-After, with jitter too: thousands of agents
        refused together must not all come back together)."""
        pause = random.uniform(delay / 2, delay)
        asked, self.retry_after = self.retry_after, None
        if asked:
            pause = max(pause, random.uniform(asked, 2 * asked))
        return pause

    def stop(self):
        self.terminals.kill_all()
        for link in [self.link, *self.relays]:
            if link is not None:
                link.close("the agent is stopping")


def parse_apps(values):
    apps = {}
    for value in values:
        slug, sep, url = value.partition("=")
        if not sep or not slug or not url.startswith("http://"):
            raise SystemExit(f"--app {value!r}: expected slug=http://host:port")
        apps[slug] = url.rstrip("/")
    return apps


def main(argv=None):
    parser = argparse.ArgumentParser(prog="workspace-agent agent", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("WORKSPACE_ACCESS_URL"), help="the platform's address (WORKSPACE_ACCESS_URL)"
    )
    parser.add_argument(
        "--app",
        action="append",
        default=[],
        metavar="SLUG=URL",
        help="an app inside the workspace, e.g. code=http://127.0.0.1:8080 (repeatable)",
    )
    parser.add_argument(
        "--pty-keep-seconds",
        type=float,
        default=300.0,
        help="how long a detached terminal's shell is kept for a reconnect (default 300)",
    )
    args = parser.parse_args(argv)
    token = os.environ.pop("WORKSPACE_AGENT_TOKEN", None)  # not inherited by the shells it starts
    if not args.url or not token:
        parser.error("--url (or WORKSPACE_ACCESS_URL) and WORKSPACE_AGENT_TOKEN in the environment are required")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return asyncio.run(_run(Agent(args.url, token, parse_apps(args.app), args.pty_keep_seconds)))


async def _run(agent):
    loop = asyncio.get_running_loop()
    stopping = loop.create_future()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, lambda: stopping.done() or stopping.set_result(None))
    running = asyncio.ensure_future(agent.run_forever())
    await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        agent.stop()
        try:
            running.result()
        except Outdated as exc:
            log.error("%s: this agent is out of date; its init script fetches the platform's own", exc)
            return OUTDATED_EXIT
    agent.stop()
    await asyncio.sleep(0.2)  # the shells get their SIGHUP, the close frames go out
    running.cancel()
    return 0
