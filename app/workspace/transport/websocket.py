"""Websockets on simple-websocket (flask-sock's engine), for the platform's routes and
for the agent program.

`accept(handler)` upgrades the current request like flask-sock's `Sock.route` does,
but the route runs first: it authenticates and answers 401 (or 404, 502, ...) before
any upgrade. `route(bp, rule)` registers a view for both kinds of request: werkzeug
matches an upgrade request only to a `websocket=True` rule and a plain request only
to a plain rule (else 400 before any view runs), and a websocket route must answer
a plain request too (with its 401, or a 400 that says what it expects).

`Transport` is what the multiplexer and the terminal write through: simple-websocket's
own `send` does one `socket.send`, which may write part of a large frame, and two
greenlets sending at once would interleave their bytes. Here a frame is written
whole, under a lock.

`FrameTransport` is the agent connection's own RFC 6455 framing
(workspace_protocol.websocket, shared with the agent program) on gunicorn's raw
socket after the handshake (`accept_frames`): the same interface as `Transport`, for
bulk bytes. wsproto unmasks in pure Python (~400 MB/s), and every byte a workspace
app sends down is masked by the agent (a client); here unmasking is an XOR of 64-bit
words in numpy, frames are read into one reused receive buffer (receive() hands out
a view of it) and written from one reused send buffer. Both buffers grow while the
connection carries bulk bytes and are given back when it idles (`trim`).
"""

import logging
import os
import socket

import numpy
from flask import Response, request
from gevent.lock import Semaphore
from prometheus_client import Gauge
from simple_websocket import ConnectionClosed, Server
from wsproto.events import BytesMessage, TextMessage

import workspace_protocol.websocket as wire
from app.common.failures import Invalid

RECEIVE_BYTES = wire.RECEIVE_BYTES
log = logging.getLogger("bundle.workspace.websocket")

# Open websockets by what they carry: `agent` (an agent's connection), `terminal`, `relay`
# (a relay peer), `app` (a workspace app's upgrade, spliced through its agent).
KINDS = ("agent", "terminal", "relay", "app")
OPEN = Gauge(
    "bundle_websockets_open",
    "Websockets open, summed over the workers, by kind (agent, terminal, relay, app: a workspace app's upgrade)",
    ["service", "kind"],
    multiprocess_mode="livesum",
)
for _kind in KINDS:
    OPEN.labels("workspace", _kind)  # every kind's series, at 0 before its first websocket


def counted(kind):
    """A context manager that counts one open websocket of `kind` (one of KINDS) while it runs."""
    if kind not in KINDS:
        raise ValueError(f"not a kind of websocket: {kind!r}")
    return OPEN.labels("workspace", kind).track_inprogress()


def route(bp, rule, **options):
    """Decorator: `rule` for plain requests (with `options`) and for websocket upgrades
    (GET only, as werkzeug requires of websocket rules)."""

    def register(view):
        bp.add_url_rule(rule, view_func=view, **options)
        upgrade_options = {**options, "methods": ["GET"], "websocket": True, "provide_automatic_options": False}
        bp.add_url_rule(rule, view_func=view, **upgrade_options)
        return view

    return register


def is_upgrade(environ=None) -> bool:
    """A websocket upgrade request: this one, or the WSGI `environ` given."""
    environ = request.environ if environ is None else environ
    return (
        environ.get("HTTP_UPGRADE", "").lower() == "websocket"
        and "upgrade" in environ.get("HTTP_CONNECTION", "").lower()
    )


def client_still_there() -> bool:
    """False when this request's client has closed its end (or reset it), as an agent
    that gave up waiting for the answer has: the connection reads as at its end. True
    with no raw socket (a test client), or with nothing or something to read."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        return True
    timeout = sock.gettimeout()
    sock.settimeout(0.0)  # a look, never a wait
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except (BlockingIOError, ValueError):  # nothing to read; or TLS, where no look is possible
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


class _AlreadyAnswered(Response):
    """The response of a request whose connection was taken over (a websocket, a
    spliced upgrade): gunicorn writes nothing more and closes the connection, as
    with flask-sock. Status 101 is what the request log shows."""

    def __call__(self, environ, start_response):
        raise StopIteration()


def taken_over():
    return _AlreadyAnswered(status=101)


def accept(handler, kind, max_message_size=None):
    """Upgrade this request to a websocket and run `handler(transport)` until it
    returns; then close the websocket. `kind`: what it carries (one of KINDS)."""
    with counted(kind):
        return _serve(
            handler, Transport(Server(request.environ, receive_bytes=RECEIVE_BYTES, max_message_size=max_message_size))
        )


def _serve(handler, transport):
    """Run `handler(transport)` until it returns or the peer goes; then close. A handler
    that fails is logged here, never answered: after the 101 the connection is the
    websocket's, and an error page written on it would leave gunicorn reading frames as
    the next request ("Invalid HTTP request line")."""
    try:
        handler(transport)
    except ConnectionClosed:
        pass
    except Exception:
        log.exception("a websocket's handler failed")
    finally:
        transport.close()
    return taken_over()


class Transport:
    """A connected simple-websocket (server or client) with whole-frame sends."""

    def __init__(self, ws):
        self.ws = ws
        self._sending = Semaphore()
        # Small frames in a row (a stream's OPEN, then its first DATA) must not wait
        # for the peer's delayed ACK (Nagle): 40 ms a request otherwise.
        try:
            ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    @property
    def connected(self):
        return self.ws.connected

    def send(self, data):
        """One message: bytes as a binary frame, str as a text frame."""
        message = (
            BytesMessage(data=data) if isinstance(data, (bytes, bytearray, memoryview)) else TextMessage(data=data)
        )
        with self._sending:
            if not self.ws.connected:
                raise ConnectionClosed(self.ws.close_reason, self.ws.close_message)
            self.ws.sock.sendall(self.ws.ws.send(message))

    def receive(self, timeout=None):
        """The next message (bytes or str); None after `timeout`; ConnectionClosed at the end."""
        return self.ws.receive(timeout)

    def close(self, code=None, message=None):
        """Send a close frame if the line is free, then shut the socket down so that
        the reader (and a sender blocked on a peer that stopped reading) ends now."""
        if self._sending.acquire(timeout=1.0):
            try:
                if self.ws.connected:
                    self.ws.close(code, message)
            except (ConnectionClosed, OSError):
                pass
            finally:
                self._sending.release()
        self.ws.connected = False
        try:
            self.ws.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.ws.event.set()  # wake a reader waiting in receive()


# --------------------------------------------------------------------------- own framing (agent connection)

# Below this, the standard library's masking costs less than numpy's per-call overhead.
NUMPY_MASK_BYTES = 512


def numpy_mask_in_place(buffer, offset, length, key):
    """workspace_protocol.websocket.mask_in_place, as an XOR of 64-bit words in numpy."""
    if length < NUMPY_MASK_BYTES:
        wire.mask_in_place(buffer, offset, length, key)
        return
    whole = length & ~7
    words = numpy.frombuffer(buffer, numpy.uint64, whole // 8, offset)
    numpy.bitwise_xor(words, numpy.frombuffer(key * 2, numpy.uint64)[0], out=words)
    for index in range(whole, length):
        buffer[offset + index] ^= key[index & 3]


class FrameTransport:
    """A websocket on a raw connected socket, after the handshake, framed by
    workspace_protocol.websocket: `client` masks what it sends and expects unmasked
    frames, the server the other way round (neither when `masking` is False: the mesh).
    receive() is for one reader; send()/send_parts() for any number of greenlets."""

    def __init__(self, sock, client, buffered=b"", max_message_size=None, masking=True):
        """masking: True (RFC 6455), False (the mesh: unmasked both ways), or "agreed"
        (a server that agreed to a client's unmasked frames: either kind is taken, in
        case a proxy dropped the agreement from the answer)."""
        self.sock, self.client = sock, client
        self._masks = client and masking is True
        self.connected = True
        self._sending = Semaphore()
        expects_mask = None if masking == "agreed" else (masking and not client)
        self._reader = wire.FrameReader(expects_mask, max_message_size, buffered, numpy_mask_in_place)
        self._out = bytearray()  # frames are encoded here, under the send lock (sized by the first)
        self._close_sent = False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # -- sending
    def send(self, data):
        """One message: bytes as a binary frame, str as a text frame."""
        if isinstance(data, str):
            self._write(wire.encode(wire.OP_TEXT, data.encode(), self._masks, numpy_mask_in_place))
        else:
            self.send_parts(b"", data)

    def send_batch(self, messages):
        """Binary messages, each a (prefix, payload), in one write."""
        self._write(
            b"".join(
                wire.encode(wire.OP_BINARY, payload, self._masks, numpy_mask_in_place, prefix)
                for prefix, payload in messages
            )
        )

    def send_parts(self, prefix, payload):
        """One binary message of `prefix` + `payload` (any bytes-like), written whole
        from the reused send buffer: fresh half-megabyte buffers per frame cost a page
        fault per 4 KiB, most of a bulk transfer's CPU."""
        length = len(prefix) + len(payload)
        key = os.urandom(4) if self._masks else b""
        head = wire.frame_head(wire.OP_BINARY, length, key)
        start = len(head)
        with self._sending:
            if not self.connected:
                raise ConnectionClosed(1006, "the connection is closed")
            out = self._out
            if len(out) < start + length:
                out = self._out = bytearray(start + length)
            out[:start] = head
            out[start : start + len(prefix)] = prefix
            out[start + len(prefix) : start + length] = payload
            if key:
                numpy_mask_in_place(out, start, length, key)
            self.sock.sendall(memoryview(out)[: start + length])

    def _write(self, data):
        with self._sending:
            if not self.connected:
                raise ConnectionClosed(1006, "the connection is closed")
            self.sock.sendall(data)

    def trim(self):
        """Give back the buffers a bulk transfer grew (the connection's keepalive calls
        this each interval): an idle connection keeps a few KiB, not half a megabyte."""
        self._reader.trim()
        if self._sending.acquire(blocking=False):  # a sender at work still uses it
            try:
                self._out = bytearray()
            finally:
                self._sending.release()

    # -- receiving
    def receive(self, timeout=None):
        """The next message: str, or a binary message as a bytes-like view of the
        receive buffer that the next receive() reuses (copy what you keep);
        ConnectionClosed at the end. (`timeout` is not supported: the multiplexer's
        reader waits for as long as it takes.)"""
        try:
            while True:
                event = self._reader.next_event()
                if event is None:
                    read = self.sock.recv_into(self._reader.space())
                    if not read:
                        raise ConnectionClosed(1006, "the connection was cut")
                    self._reader.filled(read)
                elif isinstance(event, wire.Message):
                    return event.data
                elif isinstance(event, wire.Ping):
                    self._write(wire.encode(wire.OP_PONG, event.payload, self._masks))
                elif isinstance(event, wire.Close):
                    self.close(event.code if event.code != wire.NO_STATUS else None)
                    raise ConnectionClosed(event.code, event.reason)
        except wire.Violation as exc:
            self.close(exc.code, exc.why)
            raise ConnectionClosed(exc.code, exc.why) from None
        except OSError as exc:
            self.connected = False
            raise ConnectionClosed(1006, str(exc)) from None

    def close(self, code=None, message=None):
        """Send a close frame if the line is free, then shut the socket down so that
        the reader (and a sender blocked on a peer that stopped reading) ends now."""
        if self._sending.acquire(timeout=1.0):
            try:
                if self.connected and not self._close_sent:
                    self._close_sent = True
                    self.connected = False
                    self.sock.sendall(wire.encode(wire.OP_CLOSE, wire.close_body(code, message), self._masks))
            except OSError:
                pass
            finally:
                self._sending.release()
        self.connected = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def accept_frames(handler, kind, max_message_size=None):
    """Like accept(), with FrameTransport on gunicorn's raw socket (simple-websocket's
    Transport where there is none, as under a test client). A client that asks for
    unmasked frames (wire.UNMASKED_HEADER: the agent) is answered yes."""
    environ = request.environ
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return accept(handler, kind, max_message_size)
    key = environ.get("HTTP_SEC_WEBSOCKET_KEY", "")
    if environ.get("HTTP_SEC_WEBSOCKET_VERSION") != "13" or len(key) > 64 or not key:
        raise Invalid("A websocket upgrade needs Sec-WebSocket-Key and Sec-WebSocket-Version: 13.")
    sock.settimeout(None)
    name, value = wire.UNMASKED_HEADER
    unmasked = request.headers.get(name, "").strip().lower() == value
    with counted(kind):
        sock.sendall(wire.upgrade_answer(key, [wire.UNMASKED_HEADER] if unmasked else []))
        return _serve(
            handler,
            FrameTransport(
                sock, client=False, max_message_size=max_message_size, masking="agreed" if unmasked else True
            ),
        )
