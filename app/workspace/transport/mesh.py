"""The mesh between the platform's workers: which worker holds each agent's
connection, and a link that carries a request to that worker.

Without REDIS_URL the platform runs one worker and none of this is used: an agent's
connection is in the process's `agents.connections`, or nowhere.

With REDIS_URL (several workers, several hosts), as Coder's replicas do in HA mode:

Where an agent is. The worker that accepts an agent's connection records it in
Redis, `bundle:workspace:agent:<id>` = "<its mesh address> <connection id>", for
ENTRY_SECONDS, and refreshes every entry it holds each REFRESH_SECONDS while the
connection lives: a worker that dies leaves entries that expire after three missed
refreshes. A refresh or a release changes an entry only while it names that
connection, so a reconnection elsewhere (which overwrites it) wins, and the old
holder, finding another connection named at its next refresh, closes its own. An
entry lost with Redis's data is written again by the next refresh.

The link. Each worker listens on a mesh address of its own, opened when it first
holds something: an abstract unix socket (one host), or with WORKSPACE_MESH_ADDRESS
set to this host's private address, a TCP port the kernel picks on it (several
hosts). nginx never publishes it. A worker that needs another's agent dials that
address once and keeps the link: the agent connection's multiplex protocol (mux.py)
in unmasked websocket frames, after a challenge: the listener sends a random nonce,
the dialer answers HMAC-SHA256(WORKSPACE_MESH_SECRET, nonce). Each stream opened on
a link names a kind in its metadata; the handler registered for that kind
(`serves`) runs at the far end: agents.py's "agent" (a stream to the agent, joined
to the link's), "invite" and "disconnect", relay.py's "relay" (a relay peer).

Rendezvous. A relay session's two peers may reach different workers: the first one
`claim`s the session for its worker, and the other is carried there.
"""

import hashlib
import hmac
import logging
import os
import socket
import uuid

import gevent
import redis
from gevent.lock import Semaphore
from gevent.server import StreamServer
from prometheus_client import Counter

from app.common import redis_client
from app.common.failures import Unavailable
from app.workspace.transport.mux import Mux, StreamClosed
from app.workspace.transport.websocket import FrameTransport
from workspace_protocol.mux import MESSAGE_LIMIT

REFRESH_SECONDS = 5
ENTRY_SECONDS = 3 * REFRESH_SECONDS
# A worker that does not accept a connection within this is gone (a host powered off).
CONNECT_SECONDS = 2.0
HANDSHAKE_SECONDS = 5.0
CALL_SECONDS = 10.0
MAGIC = b"bundle-workspace-mesh/1\n"
NONCE_BYTES = 16
ACCEPTED, REFUSED = b"+", b"-"

log = logging.getLogger("bundle.workspace.mesh")

# Requests (link streams) carried between workers, by the kind the handlers serve
# (agent, invite, disconnect, relay; `other` for a kind no handler serves).
KINDS = ("agent", "invite", "disconnect", "relay")
SENT = Counter(
    "bundle_workspace_mesh_requests_sent_total",
    "Requests this worker carried to the worker holding an agent or a relay, by kind and outcome (ok, unreachable)",
    ["kind", "outcome"],
)
SERVED = Counter(
    "bundle_workspace_mesh_requests_served_total",
    "Requests this worker served for another worker, by kind and outcome (ok, failed, refused: no such kind)",
    ["kind", "outcome"],
)
for _kind in KINDS:  # every series from the start, at 0
    for _outcome in ("ok", "unreachable"):
        SENT.labels(_kind, _outcome)
    for _outcome in ("ok", "failed"):
        SERVED.labels(_kind, _outcome)


def _kind_label(kind):
    return kind if kind in KINDS else "other"


# Each a Lua script, so that the test and the change are one step.
_REFRESH = """
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not value then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"""
_FORGET_ADDRESS = """
local value = redis.call('GET', KEYS[1])
if value and string.sub(value, 1, #ARGV[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"""


class Unreachable(Exception):
    """The worker at a mesh address could not be reached, or its link closed; str() says why."""


class Refused(Unreachable):
    """The worker at a mesh address answered, but refused this one (another secret)."""


def shared_state_unavailable(exc):
    log.warning("Redis unavailable: %s", redis_client.describe(exc))
    return Unavailable("The platform's shared state is unavailable; try again in a moment.", retry_after=2)


class Holding:
    """This worker's record of one agent connection it holds."""

    def __init__(self, agent_id, value, on_lost):
        self.agent_id, self.value, self.on_lost = agent_id, value, on_lost


class Mesh:
    def __init__(self):
        self.redis = None
        self.address = None  # "unix:@<name>" or "tcp:<host>:<port>", once listening
        self._secret = b""
        self._listen_host = ""
        self._server = None
        self._handlers = {}
        self._links = {}  # address -> the Mux dialed to it
        self._dialing = {}  # address -> Semaphore: one dial at a time
        self._held = {}  # Holding.value -> Holding
        self._refresher = None

    def configure(self, shared_client, secret, listen_host):
        """Called at start: the Redis client (None: the one-worker default), the
        shared secret and the address to listen on ("" for a unix socket)."""
        self.redis, self._secret, self._listen_host = shared_client, secret.encode(), listen_host
        if shared_client is not None:
            self._refresh = shared_client.register_script(_REFRESH)
            self._release = shared_client.register_script(_RELEASE)
            self._forget = shared_client.register_script(_FORGET_ADDRESS)

    def serves(self, kind):
        """Decorator: `handler(stream)` serves the link streams of `kind` (stream.meta
        holds the dialer's metadata); the stream closes when it returns."""

        def register(handler):
            self._handlers[kind] = handler
            return handler

        return register

    # ----------------------------------------------------------------- where agents are

    def hold(self, agent_id, on_lost):
        """Record that this worker holds a connection of `agent_id`; `on_lost()` runs if
        a newer connection elsewhere replaces it. Raises Unavailable (503) if Redis is down."""
        if self.redis is None:
            return Holding(agent_id, None, on_lost)
        holding = Holding(agent_id, f"{self._listen()} {uuid.uuid4().hex}", on_lost)
        try:
            self.redis.set(_agent_key(agent_id), holding.value, px=ENTRY_SECONDS * 1000)
        except redis.RedisError as exc:
            raise shared_state_unavailable(exc) from None
        self._held[holding.value] = holding
        if self._refresher is None:
            self._refresher = gevent.spawn(self._refresh_forever)
        return holding

    def release(self, holding):
        """The connection ended: drop its entry. True if the entry still named it
        (no newer connection of the agent replaced it)."""
        if holding.value is None:
            return True
        self._held.pop(holding.value, None)
        try:
            return bool(self._release(keys=[_agent_key(holding.agent_id)], args=[holding.value]))
        except redis.RedisError as exc:
            log.warning("agent %s: its entry could not be released: %s", holding.agent_id, redis_client.describe(exc))
            return True

    def holder(self, agent_id):
        """The mesh address of the worker holding the agent's connection, or None."""
        if self.redis is None:
            return None
        try:
            value = self.redis.get(_agent_key(agent_id))
        except redis.RedisError as exc:
            raise shared_state_unavailable(exc) from None
        return value.decode().split(" ", 1)[0] if value else None

    def forget(self, agent_id, address):
        """Drop the agent's entry if it still names `address` (a worker found gone)."""
        try:
            self._forget(keys=[_agent_key(agent_id)], args=[address + " "])
        except redis.RedisError:
            pass

    def _refresh_forever(self):
        while True:
            gevent.sleep(REFRESH_SECONDS)
            held = list(self._held.values())
            if held:
                self._refresh_all(held)

    def _refresh_all(self, held):
        try:
            pipe = self.redis.pipeline(transaction=False)
            for holding in held:
                self._refresh(
                    keys=[_agent_key(holding.agent_id)], args=[holding.value, ENTRY_SECONDS * 1000], client=pipe
                )
            kept = pipe.execute()
        except redis.RedisError as exc:
            log.warning("the agents' entries could not be refreshed: %s", redis_client.describe(exc))
            return
        for holding, still in zip(held, kept):
            if not still and self._held.pop(holding.value, None) is not None:
                holding.on_lost()

    # ----------------------------------------------------------------- rendezvous

    def claim(self, name, seconds):
        """The address of the worker that holds `name` (a tuple): this worker's if no
        one did (it holds it for `seconds`, or until `unclaim`). None without Redis."""
        if self.redis is None:
            return None
        address = self._listen()
        try:
            earlier = self.redis.set(_claim_key(name), address, nx=True, ex=seconds, get=True)
        except redis.RedisError as exc:
            raise shared_state_unavailable(exc) from None
        return earlier.decode() if earlier else address

    def unclaim(self, name, address=None):
        """Give `name` up if `address` (this worker's by default) still holds it."""
        if self.redis is None:
            return
        try:
            self._release(keys=[_claim_key(name)], args=[address or self.address])
        except redis.RedisError:
            pass

    # ----------------------------------------------------------------- the link

    def open(self, address, meta, data=b""):
        """A stream to the worker at `address`, served there by the handler of
        meta["kind"]; its first `data` goes with the OPEN. Raises Unreachable."""
        kind = _kind_label(meta.get("kind"))
        try:
            stream = self._link(address).open(meta, data)
        except (StreamClosed, Unreachable) as exc:
            SENT.labels(kind, "unreachable").inc()
            if isinstance(exc, Unreachable):
                raise
            raise Unreachable(str(exc)) from None
        SENT.labels(kind, "ok").inc()
        return stream

    def call(self, address, meta):
        """Open a stream, send nothing, and return the whole answer (`answer` at the far end)."""
        stream = self.open(address, meta)
        try:
            stream.write_eof()
            parts = []
            while True:
                data = stream.read(CALL_SECONDS)
                if data is None:
                    raise Unreachable(f"no answer within {CALL_SECONDS:.0f} s")
                if not data:
                    return b"".join(parts)
                parts.append(data)
        except StreamClosed as exc:
            raise Unreachable(str(exc)) from None
        finally:
            stream.close()

    @staticmethod
    def answer(stream, payload):
        """The whole answer of a `call`."""
        stream.write(payload)
        stream.write_eof()

    def _link(self, address):
        mux = self._links.get(address)
        if mux is not None and mux.closed_reason is None:
            return mux
        with self._dialing.setdefault(address, Semaphore()):
            mux = self._links.get(address)
            if mux is None or mux.closed_reason is not None:
                mux = self._links[address] = self._dial(address)
                gevent.spawn(self._run_link, address, mux)
        return mux

    def _dial(self, address):
        sock = None
        try:
            sock = _connect(address)
            sock.settimeout(HANDSHAKE_SECONDS)
            greeting = _read_exactly(sock, len(MAGIC) + NONCE_BYTES)
            if not greeting.startswith(MAGIC):
                raise Refused(f"{address} does not speak the mesh protocol")
            sock.sendall(self._proof(greeting[len(MAGIC) :]))
            if _read_exactly(sock, 1) != ACCEPTED:
                raise Refused(f"{address} refused this worker's WORKSPACE_MESH_SECRET (the hosts' secrets differ)")
            sock.settimeout(None)
        except Refused:
            sock.close()
            raise
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise Unreachable(f"{address} does not answer: {exc.strerror or exc}") from None
        return Mux(FrameTransport(sock, client=True, masking=False, max_message_size=MESSAGE_LIMIT), opens=True)

    def _run_link(self, address, mux):
        pinger = gevent.spawn(mux.keepalive, REFRESH_SECONDS)
        try:
            reason = mux.run()
        finally:
            pinger.kill()
            if self._links.get(address) is mux:
                del self._links[address]
        log.info("the link to %s ended: %s", address, reason)

    def _listen(self):
        """This worker's mesh address, listening from the first call on; Unavailable (503)
        if it cannot listen (WORKSPACE_MESH_ADDRESS not an address of this host)."""
        if self.address is None:
            try:
                self._start_listening()
            except OSError as exc:
                log.error("cannot listen for the other workers on %r: %s", self._listen_host or "a unix socket", exc)
                raise Unavailable("The platform cannot reach its other workers; see its log.", retry_after=5) from None
        return self.address

    def _start_listening(self):
        if self._listen_host:
            server = StreamServer((self._listen_host, 0), self._accept)
            server.start()
            host, port = server.address[:2]
            address = f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"
        else:
            name = f"bundle-workspace-mesh-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind("\0" + name)
            listener.listen(1024)
            server = StreamServer(listener, self._accept)
            server.start()
            address = f"unix:@{name}"
        self._server, self.address = server, address
        log.info("listening for the other workers at %s", address)

    def _accept(self, sock, peer):
        nonce = os.urandom(NONCE_BYTES)
        sock.settimeout(HANDSHAKE_SECONDS)
        try:
            sock.sendall(MAGIC + nonce)
            if not hmac.compare_digest(_read_exactly(sock, hashlib.sha256().digest_size), self._proof(nonce)):
                log.warning(
                    "refused a mesh connection from %s: not signed with WORKSPACE_MESH_SECRET", peer or "a peer"
                )
                sock.sendall(REFUSED)
                return
            sock.sendall(ACCEPTED)
        except OSError:
            return
        sock.settimeout(None)
        mux = Mux(
            FrameTransport(sock, client=False, masking=False, max_message_size=MESSAGE_LIMIT),
            opens=False,
            on_open=self._serve_stream,
        )
        watcher = gevent.spawn(mux.watch_silence, ENTRY_SECONDS)  # the dialer pings every REFRESH_SECONDS
        try:
            mux.run()
        finally:
            watcher.kill()

    def _serve_stream(self, stream):
        kind = stream.meta.get("kind")
        handler = self._handlers.get(kind)
        if handler is None:
            SERVED.labels("other", "refused").inc()
            stream.close(f"this worker serves no {str(kind)[:40]!r} streams")
            return
        outcome = "failed"
        try:
            handler(stream)
            outcome = "ok"
        except StreamClosed:  # the requester went: the request was served as far as it wanted
            outcome = "ok"
            raise
        finally:
            SERVED.labels(_kind_label(kind), outcome).inc()

    def _proof(self, nonce):
        return hmac.new(self._secret, nonce, hashlib.sha256).digest()


def _agent_key(agent_id):
    return redis_client.key("workspace", "agent", agent_id)


def _claim_key(name):
    return redis_client.key("workspace", "claim", *name)


def _connect(address):
    kind, _, rest = address.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_SECONDS)
        try:
            sock.connect("\0" + rest[1:] if rest.startswith("@") else rest)
        except OSError:
            sock.close()
            raise
        return sock
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise OSError(f"not a mesh address: {address[:80]!r}")


def _read_exactly(sock, count):
    data = b""
    while len(data) < count:
        more = sock.recv(count - len(data))
        if not more:
            raise ConnectionResetError("the connection closed during the handshake")
        data += more
    return data


mesh = Mesh()
