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

`FrameTransport` is the agent connection's own RFC 6455 framing, on the raw socket
after a handshake done here (`accept_frames` on the platform, `connect_frames` in the
agent): the same interface as `Transport`, for bulk bytes. wsproto masks and unmasks
in pure Python (~400 MB/s), and every byte a workspace app sends down pays both
(the agent is the client, so it masks); here masking is an XOR of 64-bit words in
numpy, frames are read into one reused receive buffer (receive() hands out a view of
it) and written from one reused send buffer: fresh half-megabyte buffers per frame
cost a page fault per 4 KiB, most of a bulk transfer's CPU. Client frames are
masked with a fresh random key each (RFC 6455 5.3), server frames never; fragmented
messages, PING/PONG and the closing handshake are handled; a frame that breaks
the rules closes the connection with 1002, a message over `max_message_size` with
1009.
"""
import base64
import hashlib
import os
import socket
import ssl
import struct
from urllib.parse import urlsplit

import numpy
from flask import Response, request
from gevent.lock import Semaphore
from simple_websocket import ConnectionClosed, Server
from simple_websocket import ConnectionError as HandshakeRefused
from wsproto.events import BytesMessage, TextMessage

from app.common.failures import ApiError

RECEIVE_BYTES = 256 * 1024


def route(bp, rule, **options):
    """Decorator: `rule` for plain requests (with `options`) and for websocket upgrades
    (GET only, as werkzeug requires of websocket rules)."""
    def register(view):
        bp.add_url_rule(rule, view_func=view, **options)
        upgrade_options = {**options, "methods": ["GET"], "websocket": True, "provide_automatic_options": False}
        bp.add_url_rule(rule, view_func=view, **upgrade_options)
        return view
    return register


def is_upgrade():
    return (request.headers.get("Upgrade", "").lower() == "websocket"
            and "upgrade" in request.headers.get("Connection", "").lower())


class _AlreadyAnswered(Response):
    """The response of a request whose connection was taken over (a websocket, a
    spliced upgrade): gunicorn writes nothing more and closes the connection, as
    with flask-sock. Status 101 is what the request log shows."""

    def __call__(self, environ, start_response):
        raise StopIteration()


def taken_over():
    return _AlreadyAnswered(status=101)


def accept(handler, max_message_size=None):
    """Upgrade this request to a websocket and run `handler(transport)` until it
    returns; then close the websocket."""
    return _serve(handler, Transport(Server(request.environ, receive_bytes=RECEIVE_BYTES,
                                            max_message_size=max_message_size)))


def _serve(handler, transport):
    """Run `handler(transport)` until it returns or the peer goes; then close."""
    try:
        handler(transport)
    except ConnectionClosed:
        pass
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
        message = BytesMessage(data=data) if isinstance(data, (bytes, bytearray, memoryview)) \
            else TextMessage(data=data)
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

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
HANDSHAKE_LIMIT = 64 * 1024
# Below this, one big-integer XOR costs less than numpy's per-call overhead.
NUMPY_MASK_BYTES = 512
LENGTH16, LENGTH64, CLOSE_CODE = struct.Struct("!H"), struct.Struct("!Q"), struct.Struct("!H")


def accept_value(key):
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + GUID).digest()).decode()


def mask_in_place(buffer, offset, length, key):
    """XOR `buffer[offset:offset + length]` (a bytearray) with the 4-byte `key`
    repeated, as RFC 6455 masking and unmasking do."""
    if length < NUMPY_MASK_BYTES:
        view = memoryview(buffer)[offset:offset + length]
        keys = (key * (length // 4 + 1))[:length]
        view[:] = (int.from_bytes(view, "little") ^ int.from_bytes(keys, "little")).to_bytes(length, "little")
        return
    whole = length & ~7
    words = numpy.frombuffer(buffer, numpy.uint64, whole // 8, offset)
    numpy.bitwise_xor(words, numpy.frombuffer(key * 2, numpy.uint64)[0], out=words)
    for index in range(whole, length):
        buffer[offset + index] ^= key[index & 3]


def frame_head(opcode, length, key=b""):
    first, masked = 0x80 | opcode, 0x80 if key else 0
    if length < 126:
        head = bytes((first, masked | length))
    elif length < 65536:
        head = bytes((first, masked | 126)) + LENGTH16.pack(length)
    else:
        head = bytes((first, masked | 127)) + LENGTH64.pack(length)
    return head + key


class FrameTransport:
    """A websocket on a raw connected socket, after the handshake: `client` masks
    what it sends and expects unmasked frames, the server the other way round.
    receive() is for one reader; send()/send_parts() for any number of greenlets."""

    def __init__(self, sock, client, buffered=b"", max_message_size=None, masking=True):
        self.sock, self.client = sock, client
        # RFC 6455 masks what a client sends. The mesh between the platform's own
        # workers (mesh.py) speaks these frames unmasked both ways: masking guards
        # proxies in between, and there are none there.
        self._masks = client and masking
        self._expects_mask = masking and not client
        self.max_message_size = max_message_size
        self.connected = True
        self._sending = Semaphore()
        # Received bytes land in one reused buffer, [_start:_end] not yet parsed; a
        # binary frame is encoded into one reused buffer under the send lock.
        self._in = bytearray(max(RECEIVE_BYTES, len(buffered)))
        self._in[:len(buffered)] = buffered
        self._start, self._end = 0, len(buffered)
        self._out = bytearray(RECEIVE_BYTES)
        self._close_sent = False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # -- sending
    def send(self, data):
        """One message: bytes as a binary frame, str as a text frame."""
        if isinstance(data, str):
            self._send_frame(OP_TEXT, data.encode())
        else:
            self.send_parts(b"", data)

    def send_batch(self, messages):
        """Binary messages, each a (prefix, payload), in one write."""
        self._write(b"".join(self._encode(prefix, payload) for prefix, payload in messages))

    def send_parts(self, prefix, payload):
        """One binary message of `prefix` + `payload` (any bytes-like), written whole
        from the reused send buffer."""
        length = len(prefix) + len(payload)
        key = os.urandom(4) if self._masks else b""
        head = frame_head(OP_BINARY, length, key)
        start = len(head)
        with self._sending:
            if not self.connected:
                raise ConnectionClosed(1006, "the connection is closed")
            out = self._out
            if len(out) < start + length:
                out = self._out = bytearray(start + length)
            out[:start] = head
            out[start:start + len(prefix)] = prefix
            out[start + len(prefix):start + length] = payload
            if key:
                mask_in_place(out, start, length, key)
            self.sock.sendall(memoryview(out)[:start + length])

    def _encode(self, prefix, payload):
        length = len(prefix) + len(payload)
        if self._masks:
            key = os.urandom(4)
            head = frame_head(OP_BINARY, length, key)
            pad = -len(head) % 8  # the masked part starts 8-aligned: numpy XORs aligned words
            start = pad + len(head)
            out = bytearray(start + length)
            out[pad:start] = head
            out[start:start + len(prefix)] = prefix
            out[start + len(prefix):] = payload
            mask_in_place(out, start, length, key)
            return memoryview(out)[pad:]
        return b"".join((frame_head(OP_BINARY, length), prefix, payload))

    def _send_frame(self, opcode, payload):
        if self._masks:
            key = os.urandom(4)
            body = bytearray(payload)
            mask_in_place(body, 0, len(body), key)
            self._write(frame_head(opcode, len(body), key) + body)
        else:
            self._write(frame_head(opcode, len(payload)) + payload)

    def _write(self, data):
        with self._sending:
            if not self.connected:
                raise ConnectionClosed(1006, "the connection is closed")
            self.sock.sendall(data)

    # -- receiving
    def _fill(self, count):
        """At least `count` unparsed bytes in the receive buffer, read as they come."""
        if self._end - self._start >= count:
            return
        buffer = self._in
        if self._start + count > len(buffer):  # move the unparsed rest to the front (or a larger buffer)
            pending = self._end - self._start
            if count > len(buffer):
                self._in = bytearray(max(count, RECEIVE_BYTES))
            self._in[:pending] = buffer[self._start:self._end]
            buffer, self._start, self._end = self._in, 0, pending
        view = memoryview(buffer)
        while self._end - self._start < count:
            read = self.sock.recv_into(view[self._end:])
            if not read:
                raise ConnectionClosed(1006, "the connection was cut")
            self._end += read

    def _take(self, count):
        """The next `count` bytes: a view of the receive buffer, valid until the next
        read (the caller copies what it keeps)."""
        self._fill(count)
        start = self._start
        self._start += count
        return memoryview(self._in)[start:start + count]

    def _protocol_error(self, code, why):
        self.close(code, why)
        raise ConnectionClosed(code, why)

    def _frame(self):
        """(fin, opcode, payload as a bytearray) of the next frame."""
        self._fill(2)
        first, second = self._in[self._start], self._in[self._start + 1]
        length, masked = second & 0x7F, second & 0x80
        size = 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if masked else 0)
        head = bytes(self._take(size))
        if length == 126:
            length = LENGTH16.unpack_from(head, 2)[0]
        elif length == 127:
            length = LENGTH64.unpack_from(head, 2)[0]
        if first & 0x70:
            self._protocol_error(1002, "reserved bits are set")
        if bool(masked) != self._expects_mask:
            self._protocol_error(1002, "a client's frames must be masked, a server's must not")
        if self.max_message_size is not None and length > self.max_message_size:
            self._protocol_error(1009, "the message is too large")
        payload = self._take(length)
        if masked:
            mask_in_place(payload.obj, self._start - length, length, head[-4:])
        return first & 0x80, first & 0x0F, payload

    def receive(self, timeout=None):
        """The next message: str, or a binary message as a bytes-like view of the
        receive buffer that the next receive() reuses (copy what you keep);
        ConnectionClosed at the end. (`timeout` is not supported: the multiplexer's
        reader waits for as long as it takes.)"""
        parts, opcode = [], None
        try:
            while True:
                fin, kind, payload = self._frame()
                if kind >= OP_CLOSE:
                    self._control(kind, payload)
                    continue
                if (kind == OP_CONTINUATION) != (opcode is not None) or kind not in (0, OP_TEXT, OP_BINARY):
                    self._protocol_error(1002, "unexpected frame")
                opcode = kind if opcode is None else opcode
                if fin and not parts:
                    message = payload  # the usual unfragmented message: no copy
                else:
                    parts.append(bytes(payload))  # the buffer is reused by the next read
                    if self.max_message_size is not None and sum(map(len, parts)) > self.max_message_size:
                        self._protocol_error(1009, "the message is too large")
                    if not fin:
                        continue
                    message = b"".join(parts)
                return bytes(message).decode() if opcode == OP_TEXT else message
        except OSError as exc:
            self.connected = False
            raise ConnectionClosed(1006, str(exc)) from None

    def _control(self, kind, payload):
        if kind == OP_PING:
            self._send_frame(OP_PONG, bytes(payload))
        elif kind == OP_CLOSE:
            code = CLOSE_CODE.unpack_from(payload)[0] if len(payload) >= 2 else 1005
            self.close(code if len(payload) >= 2 else None)
            raise ConnectionClosed(code, bytes(payload[2:]).decode(errors="replace"))
        elif kind != OP_PONG:
            self._protocol_error(1002, "unknown control frame")

    def close(self, code=None, message=None):
        """Send a close frame if the line is free, then shut the socket down so that
        the reader (and a sender blocked on a peer that stopped reading) ends now."""
        if self._sending.acquire(timeout=1.0):
            try:
                if self.connected and not self._close_sent:
                    self._close_sent = True
                    body = CLOSE_CODE.pack(code or 1000) + (message or "").encode()[:120]
                    self.connected = False
                    if self._masks:
                        key = os.urandom(4)
                        masked = bytearray(body)
                        mask_in_place(masked, 0, len(masked), key)
                        self.sock.sendall(frame_head(OP_CLOSE, len(body), key) + masked)
                    else:
                        self.sock.sendall(frame_head(OP_CLOSE, len(body)) + body)
            except OSError:
                pass
            finally:
                self._sending.release()
        self.connected = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def accept_frames(handler, max_message_size=None):
    """Like accept(), with FrameTransport on gunicorn's raw socket (simple-websocket's
    Transport where there is none, as under a test client)."""
    environ = request.environ
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return accept(handler, max_message_size)
    key = environ.get("HTTP_SEC_WEBSOCKET_KEY", "")
    if environ.get("HTTP_SEC_WEBSOCKET_VERSION") != "13" or len(key) > 64 or not key:
        raise ApiError(400, "A websocket upgrade needs Sec-WebSocket-Key and Sec-WebSocket-Version: 13.")
    sock.settimeout(None)
    sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept_value(key).encode() + b"\r\n\r\n")
    return _serve(handler, FrameTransport(sock, client=False, max_message_size=max_message_size))


def connect_frames(url, headers, timeout=10.0, max_message_size=None):
    """A client FrameTransport to a ws:// or wss:// `url`; HandshakeRefused (with the
    HTTP status) when the server answers something else than the upgrade."""
    parts = urlsplit(url)
    secure = parts.scheme == "wss"
    sock = socket.create_connection((parts.hostname, parts.port or (443 if secure else 80)), timeout=timeout)
    try:
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
                 f"Host: {parts.netloc}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            if not data or len(answer) > HANDSHAKE_LIMIT:
                raise ConnectionResetError("the server closed the connection during the handshake")
            answer += data
        head, rest = answer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)[1] if lines[0].count(" ") >= 1 else ""
        if status != "101":
            raise HandshakeRefused(int(status) if status.isdigit() else 0)
        fields = {name.strip().lower(): value.strip() for name, _, value in
                  (line.partition(":") for line in lines[1:])}
        if fields.get("sec-websocket-accept") != accept_value(key):
            raise HandshakeRefused(101)
        sock.settimeout(None)
        return FrameTransport(sock, client=True, buffered=rest, max_message_size=max_message_size)
    except BaseException:
        sock.close()
        raise
