"""RFC 6455 websockets, sans-IO: the opening handshake's fields and the framing.

    reader = FrameReader(expects_mask=False)      # a client reads unmasked frames
    count = sock.recv_into(reader.space())       # the caller does the reading...
    reader.filled(count)
    while (event := reader.next_event()) is not None:
        ...                                      # Message, Ping, Pong or Close

    sock.sendall(encode(OP_BINARY, payload, masked=True))   # ...and the writing

A frame that breaks the rules raises Violation(code, why): the caller closes with
that code. A client masks what it sends with a fresh random key per frame and
expects unmasked frames; a server the other way round. The platform's own workers
(app/workspace/transport/mesh.py) speak these frames unmasked both ways: masking guards
proxies in between, and there are none there.

UNMASKED_HEADER: an agent asks the platform, in its upgrade request, to exchange
unmasked frames both ways, and masks unless the 101 answer repeats the header.
Masking keeps bytes that someone else chose (a page's script in a browser; here, what
a shared app sends) from reaching a transparent proxy in between as if they were
HTTP. The agent asks only where no proxy can read them (over TLS, or to a loopback
address), and a server that agreed still takes masked frames. The relay's
websockets, which other clients reach too, stay masked.

Masking is a XOR of every byte with a 4-byte key. `mask_in_place` does it with the
standard library (bytes.translate on each of the four strided slices: ~0.9 GB/s);
the platform plugs in a numpy one (`masker=`), several times faster again.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Union

# XORs `length` bytes of a bytearray from `offset` with a 4-byte key, in place.
Masker = Callable[[bytearray, int, int, bytes], None]

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
HANDSHAKE_LIMIT = 64 * 1024
# A busy connection's receive buffer: bulk bytes arrive in reads this large.
RECEIVE_BYTES = 256 * 1024
# An idle connection's (where it starts, and what trim() brings a busy one back to): a
# platform holds thousands of idle agents, and 256 KiB each was most of its memory.
IDLE_RECEIVE_BYTES = 4 * 1024
UNMASKED_HEADER = ("Workspace-Agent-Frames", "unmasked")
MIN_READ = 64 * 1024  # a read into less room than this is moved to the front first (a busy buffer's)
LENGTH16, LENGTH64, CLOSE_CODE = struct.Struct("!H"), struct.Struct("!Q"), struct.Struct("!H")
PROTOCOL_ERROR, INVALID_DATA, TOO_LARGE, NO_STATUS = 1002, 1007, 1009, 1005
MAX_FRAGMENTS = 1024  # of one message: the frames' heads cost more than their data past this
_XOR_TABLES = [bytes(value ^ key for value in range(256)) for key in range(256)]


class Violation(Exception):
    """The peer broke RFC 6455: close the connection with `code`."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


class HandshakeRefused(Exception):
    """The server answered the upgrade with something else than 101 (`status`, 0 if
    unreadable; 101 when its Sec-WebSocket-Accept is wrong)."""

    def __init__(self, status: int, retry_after: float | None = None) -> None:
        super().__init__(f"the server refused the websocket upgrade (HTTP {status})")
        self.status_code = status
        self.retry_after = retry_after  # its Retry-After, in seconds, if it said one


# --------------------------------------------------------------------------- the opening handshake


def accept_value(key: str) -> str:
    """The Sec-WebSocket-Accept that answers Sec-WebSocket-Key `key`."""
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + GUID).digest()).decode()


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


def upgrade_request(host: str, target: str, key: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """The client's upgrade request for `target` (path and query) on `host`."""
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    lines += [f"{name}: {value}" for name, value in dict(headers).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def upgrade_answered(received: bytes, key: str) -> tuple[dict[str, str], bytes] | None:
    """None while `received` (bytes from the server) lacks the answer's end; else
    (its header fields, lower-cased names; the bytes after it: the first frames, if
    any). HandshakeRefused if not an upgrade."""
    if b"\r\n\r\n" not in received:
        if len(received) > HANDSHAKE_LIMIT:
            raise HandshakeRefused(0)
        return None
    head, rest = received.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)[1] if lines[0].count(" ") >= 1 else ""
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    if status != "101":
        retry_after = fields.get("retry-after", "")
        raise HandshakeRefused(
            int(status) if status.isdigit() else 0, min(int(retry_after), 3600) if retry_after.isdigit() else None
        )
    if fields.get("sec-websocket-accept") != accept_value(key):
        raise HandshakeRefused(101)
    return fields, rest


def upgrade_answer(key: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """The server's 101 answer to Sec-WebSocket-Key `key`, with more `headers`."""
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {accept_value(key)}",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# --------------------------------------------------------------------------- frames out


def mask_in_place(buffer: bytearray, offset: int, length: int, key: bytes) -> None:
    """XOR `buffer[offset:offset + length]` (a bytearray) with the 4-byte `key` repeated."""
    for phase in range(min(4, length)):  # an empty strided slice would be a resize: BufferError
        start = offset + phase
        part = slice(start, offset + length, 4)
        buffer[part] = buffer[part].translate(_XOR_TABLES[key[phase]])


def frame_head(opcode: int, length: int, key: bytes = b"") -> bytes:
    first, masked = 0x80 | opcode, 0x80 if key else 0
    if length < 126:
        head = bytes((first, masked | length))
    elif length < 65536:
        head = bytes((first, masked | 126)) + LENGTH16.pack(length)
    else:
        head = bytes((first, masked | 127)) + LENGTH64.pack(length)
    return head + key


def encode(
    opcode: int,
    payload: bytes | bytearray | memoryview,
    masked: bool,
    masker: Masker = mask_in_place,
    prefix: bytes = b"",
) -> bytearray:
    """One whole frame of `prefix` + `payload` (bytes-like), masked with a fresh key
    if `masked`: the two are copied once, into the frame."""
    length = len(prefix) + len(payload)
    key = os.urandom(4) if masked else b""
    head = frame_head(opcode, length, key)
    start = len(head)
    out = bytearray(start + length)
    out[:start] = head
    out[start : start + len(prefix)] = prefix
    out[start + len(prefix) :] = payload
    if masked:
        masker(out, start, length, key)
    return out


# Room a caller leaves before a payload for frame_around(): the longest frame head
# (10 bytes), its mask key (4) and a prefix of up to 8 bytes.
ROOM_BEFORE = 22


def frame_around(
    opcode: int,
    buffer: bytearray,
    start: int,
    length: int,
    masked: bool,
    prefix: bytes = b"",
    masker: Masker = mask_in_place,
) -> memoryview:
    """The frame of `prefix` + `buffer[start:start + length]` built in place: its head
    and `prefix` are written into the ROOM_BEFORE bytes before `start`, the payload
    masked where it lies if `masked`. Returns the frame, a view of `buffer`: no copy."""
    key = os.urandom(4) if masked else b""
    head = frame_head(opcode, len(prefix) + length, key)
    payload_start = start - len(prefix)
    first = payload_start - len(head)
    if first < 0 or len(prefix) > 8:
        raise ValueError("no room before the payload for its frame head")
    buffer[first:payload_start] = head
    buffer[payload_start:start] = prefix
    if masked:
        masker(buffer, payload_start, len(prefix) + length, key)
    return memoryview(buffer)[first : start + length]


def close_body(code: int | None, reason: str | None = "") -> bytes:
    return CLOSE_CODE.pack(code or 1000) + (reason or "").encode()[:120]


# --------------------------------------------------------------------------- frames in

# Frozen dataclasses, as h11's events (and the mux's).


@dataclass(frozen=True)
class Message:
    """A whole data message: `data` is str for a text message, else a bytes-like view
    that the reader's next call may overwrite (copy what you keep)."""

    data: str | bytes | memoryview


@dataclass(frozen=True)
class Ping:
    payload: bytes


@dataclass(frozen=True)
class Pong:
    pass


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


# What FrameReader.next_event returns (None aside).
Event = Union[Message, Ping, Pong, Close]


class FrameReader:
    """Parses frames from bytes the caller puts in its buffer (space() and filled(),
    or feed()). next_event() returns the next Message, Ping, Pong or Close, or None
    when more bytes are needed."""

    def __init__(
        self,
        expects_mask: bool | None,
        max_message_size: int | None = None,
        buffered: bytes = b"",
        masker: Masker = mask_in_place,
    ) -> None:
        """expects_mask: True (a server's reader), False (a client's), None: either (a
        server that agreed to unmasked frames, in case a proxy dropped the agreement)."""
        self.expects_mask, self.max_message_size, self.masker = expects_mask, max_message_size, masker
        self._in = bytearray(max(IDLE_RECEIVE_BYTES, len(buffered)))
        self._in[: len(buffered)] = buffered
        self._start, self._end = 0, len(buffered)
        self._offered = 0  # the room the last space() gave
        self._filled_room = False  # the last read filled all of it: the peer sends in bulk
        self._trim_wanted = False
        self._needed = 2  # bytes of the frame being parsed, once its head is known
        # a fragmented message so far
        self._parts: list[bytes] = []
        self._opcode: int | None = None
        self._parts_size = 0

    def space(self) -> memoryview:
        """A writable view of the buffer's free part (room for at least the frame
        being parsed). Valid until the next call: it may move unparsed bytes, or
        change buffers (the only place that does: a read into the old one is over)."""
        pending = self._end - self._start
        if self._trim_wanted and not pending and len(self._in) > IDLE_RECEIVE_BYTES:
            self._in = bytearray(IDLE_RECEIVE_BYTES)
        self._trim_wanted = False
        wanted = max(self._needed, pending + min(MIN_READ, len(self._in) // 2))
        if self._filled_room and len(self._in) < RECEIVE_BYTES:
            wanted = max(wanted, RECEIVE_BYTES)  # a bulk transfer began: read it in large reads
        if not pending or self._start + wanted > len(self._in):
            if wanted > len(self._in):  # a frame larger than the buffer
                bigger = bytearray(wanted)
                bigger[:pending] = self._in[self._start : self._end]
                self._in = bigger
            else:  # the same buffer, the unparsed rest moved to its front: no new pages
                self._in[:pending] = self._in[self._start : self._end]
            self._start, self._end = 0, pending
        room = memoryview(self._in)[self._end :]
        self._offered = len(room)
        return room

    def filled(self, count: int) -> None:
        self._end += count
        self._filled_room = count >= self._offered

    @property
    def capacity(self) -> int:
        """The bytes its buffer holds now (what a connection's reader costs)."""
        return len(self._in)

    def trim(self) -> None:
        """Give a large buffer back once it is empty (at the next space()): a connection
        that carried a bulk transfer goes back to an idle one's few KiB. Safe from
        another greenlet or task than the reader's: it only asks."""
        self._trim_wanted = True

    def take_all(self) -> bytes:
        """The unparsed bytes, taken out (the HTTP answer before the first frame)."""
        data = bytes(self._in[self._start : self._end])
        self._start = self._end
        return data

    def feed(self, data: bytes) -> None:
        while data:
            room = self.space()
            count = min(len(room), len(data))
            room[:count] = data[:count]
            self.filled(count)
            data = data[count:]

    def next_event(self) -> Event | None:
        while True:
            frame = self._frame()
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode >= OP_CLOSE:
                return self._control(opcode, payload)
            message = self._data(fin, opcode, payload)
            if message is not None:
                return message

    def _frame(self) -> tuple[int, int, memoryview] | None:
        """(fin, opcode, payload view) of the next whole frame, or None."""
        available = self._end - self._start
        if available < 2:
            self._needed = 2
            return None
        buffer, start = self._in, self._start
        first, second = buffer[start], buffer[start + 1]
        length, masked = second & 0x7F, second & 0x80
        head = 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if masked else 0)
        if available < head:
            self._needed = head
            return None
        if length == 126:
            length = LENGTH16.unpack_from(buffer, start + 2)[0]
        elif length == 127:
            length = LENGTH64.unpack_from(buffer, start + 2)[0]
        if first & 0x70:
            raise Violation(PROTOCOL_ERROR, "reserved bits are set")
        if self.expects_mask is not None and bool(masked) != self.expects_mask:
            raise Violation(PROTOCOL_ERROR, "a client's frames must be masked, a server's must not")
        if self.max_message_size is not None and length > self.max_message_size:
            raise Violation(TOO_LARGE, "the message is too large")
        if available < head + length:
            self._needed = head + length
            return None
        self._needed, self._start = 2, start + head + length
        if masked:
            self.masker(buffer, start + head, length, bytes(buffer[start + head - 4 : start + head]))
        return first & 0x80, first & 0x0F, memoryview(buffer)[start + head : start + head + length]

    def _control(self, opcode: int, payload: memoryview) -> Event:
        if opcode == OP_PING:
            return Ping(bytes(payload))
        if opcode == OP_PONG:
            return Pong()
        if opcode == OP_CLOSE:
            if len(payload) < 2:
                return Close(NO_STATUS, "")
            return Close(CLOSE_CODE.unpack_from(payload)[0], bytes(payload[2:]).decode(errors="replace"))
        raise Violation(PROTOCOL_ERROR, "unknown control frame")

    def _data(self, fin: int, opcode: int, payload: memoryview) -> Message | None:
        if (opcode == OP_CONTINUATION) != (self._opcode is not None) or opcode not in (0, OP_TEXT, OP_BINARY):
            raise Violation(PROTOCOL_ERROR, "unexpected frame")
        if fin and self._opcode is None:
            return Message(_text(payload) if opcode == OP_TEXT else payload)  # the usual: no copy
        self._opcode = self._opcode if self._opcode is not None else opcode
        self._parts.append(bytes(payload))  # the buffer is reused by the next read
        self._parts_size += len(payload)
        if self.max_message_size is not None and self._parts_size > self.max_message_size:
            raise Violation(TOO_LARGE, "the message is too large")
        if len(self._parts) > MAX_FRAGMENTS:
            raise Violation(TOO_LARGE, f"a message in more than {MAX_FRAGMENTS} fragments")
        if not fin:
            return None
        data, opcode = b"".join(self._parts), self._opcode
        self._parts, self._opcode, self._parts_size = [], None, 0
        return Message(_text(data) if opcode == OP_TEXT else data)


def _text(payload: bytes | memoryview) -> str:
    try:
        return bytes(payload).decode()
    except UnicodeDecodeError:
        raise Violation(INVALID_DATA, "a text message that is not UTF-8") from None
