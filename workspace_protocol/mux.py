"""The multiplex protocol, sans-IO: many byte streams over one websocket.

Every websocket message is one binary frame:

    +--------+----------------+-------------------------+
    | type   | stream id      | payload                 |
    | 1 byte | 4 bytes, BE    | the rest of the message |
    +--------+----------------+-------------------------+

Types:

    1 HELLO   stream 0, JSON. Agent -> platform first: {"version", "agent_version", "apps":
              [{"slug", "url"}], "hostname"}; the platform answers {"version", "ping_seconds",
              "agent_id"}. Both sides speak VERSION only: a HELLO with another version closes
              the connection with close code VERSION_REFUSED and a reason that names both
              versions (version_mismatch); the agent then exits for its init script to fetch
              the platform's own agent.
    2 OPEN    a new stream, JSON metadata: {"kind": "app", "url"} (dial the app and
              splice raw bytes) or {"kind": "pty", "reconnect", "rows", "cols"}.
              Only the side that was given `opens=True` opens streams (the platform).
    3 DATA    bytes of the stream, at most MAX_DATA, within the receiver's window.
    4 EOF     the sender will send no more DATA on this stream (a half-close; the
              other direction goes on).
    5 CLOSE   the stream is over in both directions; UTF-8 reason, may be empty.
              Data already received can still be read.
    6 WINDOW  4 bytes BE: the receiver consumed that many bytes; the sender may send
              that many more. Each direction of a stream starts with WINDOW_BYTES (4 MiB).
    7 PING    stream 0, opaque payload; answered by PONG with the same payload.
    8 PONG
    9 RESIZE  JSON {"rows", "cols"} for a pty stream.
   10 RELAY   stream 0, platform -> agent, JSON {"session", "apps": [{"slug", "url"}]}:
              a client waits on the relay for this agent in that session; the agent dials
              /relay?role=agent&agent=<its agent_id>&session=<session> and serves this same
              protocol over that websocket. A peer ignores connection frames of a type it
              does not know.

Over a relay session the client plays the platform's part: it opens the streams, the
agent serves them. Both send a HELLO {"version"} first and check the other's. An app
stream is opened there by slug, {"kind": "app", "slug"}, never by URL.

Back-pressure: a sender with no window left waits, so a slow reader slows its writer
down instead of filling memory: a stream's receive buffer never holds more than
WINDOW_BYTES, and a peer that sends past its window has the stream closed on it.

Keepalive: the platform sends a PING every `ping_seconds`; MISSED_PONGS PINGs without
a PONG close the connection. The agent reconnects when nothing at all arrives for two
intervals and a second.

This module keeps each end's state (`Connection`, `StreamState`) and turns received
messages into events; the drivers (app/workspace/transport/mux.py on gevent, the agent's on
asyncio) do the waiting, the reading and the writing.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

# What a HELLO, RELAY or OPEN carries: a JSON object.
Info = dict[str, Any]
# A stream's maker: (stream id, its OPEN metadata) -> the StreamState (a driver's subclass).
StreamFactory = Callable[[int, Info], "StreamState"]

VERSION = 2  # 2: 4 MiB windows, DATA frames up to 512 KiB (RELAY needs no new version: see above)
HELLO, OPEN, DATA, EOF, CLOSE, WINDOW, PING, PONG, RESIZE, RELAY = range(1, 11)
# The websocket close code of a HELLO with another version: one of the range left to
# applications (4000-4999), never mistaken for a framing error (1002).
VERSION_REFUSED = 4010
# RFC 6455's "try again later": the platform cannot hold this connection now (a worker
# at its most agents, its shared state away); the agent retries with backoff.
TRY_AGAIN_LATER = 1013
OUTDATED_EXIT = 3  # the agent's exit status then: its init script fetches the platform's agent
HEADER = struct.Struct("!BI")
COUNT = struct.Struct("!I")
# Measured with bench/workspace_apps.py: larger frames and windows cut the per-frame
# cost of bulk transfers (a 100 MB download); a stream still buffers at most a window.
MAX_DATA = 512 * 1024
MESSAGE_LIMIT = MAX_DATA + 64 * 1024  # a DATA frame and its header; JSON frames are small
WINDOW_BYTES = 4 * 1024 * 1024
# Consumed bytes are granted back in batches, not per read.
GRANT_BYTES = WINDOW_BYTES // 4
MISSED_PONGS = 2
PAST_THE_WINDOW = "protocol error: data past the window"


class StreamClosed(Exception):
    """The stream was closed or reset before its end; `str()` says why."""


def frame(kind: int, stream_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, stream_id) + payload


def json_payload(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def version_mismatch(info: Info, peer: str, me: str) -> str | None:
    """None if the peer's HELLO `info` speaks VERSION; else why not (a close reason)."""
    version = info.get("version")
    if version == VERSION:
        return None
    return f"the {peer} speaks protocol version {version!r}, the {me} version {VERSION}"


def hello_frame(info: Info) -> bytes:
    """Our HELLO: `info` with the protocol's VERSION."""
    return frame(HELLO, 0, json_payload({"version": VERSION, **info}))


def relay_frame(info: Info) -> bytes:
    """Platform -> agent: a RELAY invitation."""
    return frame(RELAY, 0, json_payload(info))


def resize_payload(rows: int, cols: int) -> bytes:
    return json_payload({"rows": rows, "cols": cols})


class StreamState:
    """One stream's bytes and windows. Received data waits in `chunks` until taken;
    what the peer may still receive is `send_window`."""

    def __init__(self, stream_id: int, meta: Info) -> None:
        self.id, self.meta = stream_id, meta
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof_received = False
        self.eof_sent = False
        self.closed_reason: str | None = None
        self.send_window = WINDOW_BYTES
        self.consumed = 0
        self.unheard_size: tuple[int, int] | None = None  # the last RESIZE, until a terminal takes it
        self.on_resize: Callable[[int, int], object] | None = None  # a terminal's: callable(rows, cols)

    # -- receiving
    def take(self) -> tuple[bytes | None, bytes | None]:
        """(the next received chunk or None, a WINDOW frame to send or None)."""
        if not self.chunks:
            return None, None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        return chunk, self._grant(len(chunk))

    def take_all(self) -> tuple[bytes, bytes | None]:
        """(everything received and not taken yet, a WINDOW frame to send or None)."""
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        return data, self._grant(len(data))

    def _grant(self, count: int) -> bytes | None:
        self.consumed += count
        if self.consumed < GRANT_BYTES or self.closed_reason is not None:
            return None
        granted, self.consumed = self.consumed, 0
        return frame(WINDOW, self.id, COUNT.pack(granted))

    def deliver_size(self) -> None:
        """Hand the last RESIZE to `on_resize`, once a terminal has set one."""
        if self.on_resize and self.unheard_size:
            size, self.unheard_size = self.unheard_size, None
            self.on_resize(*size)

    # -- sending
    def reserve(self, wanted: int) -> int:
        """How many of `wanted` bytes may go in the next DATA frame now (0: wait for
        a WINDOW); they are counted as sent."""
        count = min(wanted, MAX_DATA, self.send_window)
        self.send_window -= count
        return count

    def eof_frame(self) -> bytes | None:
        """The EOF frame to send, once; None if sent already or closed."""
        if self.eof_sent or self.closed_reason is not None:
            return None
        self.eof_sent = True
        return frame(EOF, self.id)

    def close_frame(self, reason: str) -> bytes | None:
        """Close this side: the CLOSE frame to send, or None if closed already."""
        if self.closed_reason is not None:
            return None
        self.closed_reason = reason or "closed"
        return frame(CLOSE, self.id, reason.encode()[:1024])

    def resize_frame(self, rows: int, cols: int) -> bytes | None:
        return None if self.closed_reason is not None else frame(RESIZE, self.id, resize_payload(rows, cols))


# --------------------------------------------------------------------------- events of a received message
# Frozen dataclasses, as h11's events: values that say what a received message
# meant. Each is its own class (none is a subclass of another), so a driver may test
# them in any order.


@dataclass(frozen=True)
class Hello:
    """The peer's HELLO: its `info` (check it with version_mismatch)."""

    info: Info


@dataclass(frozen=True)
class Relay:
    """Platform -> agent: join the relay session in `info` ({"session", "apps"})."""

    info: Info


@dataclass(frozen=True)
class Pong:
    """The peer answered a PING."""


@dataclass(frozen=True)
class Opened:
    """The peer opened `stream`: serve it."""

    stream: StreamState


@dataclass(frozen=True)
class Changed:
    """`stream` has something new: data, its end, a window, a close, or a size."""

    stream: StreamState


@dataclass(frozen=True)
class Reply:
    """A frame to send back (a PONG, a stream's CLOSE; None: nothing after all)."""

    frame: bytes | None


@dataclass(frozen=True)
class Broken:
    """The peer broke the protocol: close the connection with `reason`."""

    reason: str


# What `Connection.receive` returns a list of (a Union, not a base class: a driver's
# isinstance chain over it is checked for what each branch may use).
Event = Union[Hello, Relay, Pong, Opened, Changed, Reply, Broken]


class Connection:
    """One end of a multiplexed connection. `receive(message)` returns the events of
    one received message; `open(meta)` starts a stream (the opening side only).
    `new_stream(stream_id, meta)` makes the StreamState (a driver's subclass)."""

    def __init__(self, opens: bool, accepts: bool, new_stream: StreamFactory = StreamState) -> None:
        self.opens, self.accepts, self.new_stream = opens, accepts, new_stream
        self.streams: dict[int, StreamState] = {}
        self._next_id = 1
        self.unanswered_pings = 0

    def open(self, meta: Info, data: bytes = b"") -> tuple[StreamState, list[tuple[bytes, bytes]], bytes]:
        """(a new stream, its OPEN frame and the first of `data` as far as the window
        allows, as (header, payload) pairs to send in one write; the rest of `data`,
        for the stream's write)."""
        stream_id, self._next_id = self._next_id, self._next_id + 1
        stream = self.streams[stream_id] = self.new_stream(stream_id, meta)
        frames = [(HEADER.pack(OPEN, stream_id), json_payload(meta))]
        count = stream.reserve(len(data))
        if count:
            frames.append((HEADER.pack(DATA, stream_id), data[:count]))
        return stream, frames, data[count:]

    def closed(self, stream: StreamState, reason: str) -> None:
        """`stream` is over (closed by either side or with the connection)."""
        if stream.closed_reason is None:
            stream.closed_reason = reason or "closed by the peer"
        self.streams.pop(stream.id, None)

    def ping(self, payload: bytes) -> bytes:
        self.unanswered_pings += 1
        return frame(PING, 0, payload)

    def receive(self, message: object) -> list[Event]:
        """The events of one received websocket message (any message: a text one, or
        a binary one too short, is the peer's error)."""
        if not isinstance(message, (bytes, bytearray, memoryview)) or len(message) < HEADER.size:
            return [Broken("protocol error: a frame must be a binary message of at least 5 bytes")]
        kind, stream_id = HEADER.unpack_from(message)
        payload = bytes(memoryview(message)[HEADER.size :])  # the one copy: the transport reuses its buffer
        if stream_id == 0:
            return self._connection_frame(kind, payload)
        if kind == OPEN:
            return self._peer_opened(stream_id, payload)
        return self._stream_frame(kind, stream_id, payload)

    def _connection_frame(self, kind: int, payload: bytes) -> list[Event]:
        if kind == PING:
            return [Reply(frame(PONG, 0, payload))]
        if kind == PONG:
            self.unanswered_pings = 0
            return [Pong()]
        if kind in (HELLO, RELAY):
            try:
                info = json.loads(payload)
            except ValueError:
                return [Broken(f"protocol error: {'HELLO' if kind == HELLO else 'RELAY'} is not JSON")]
            info = info if isinstance(info, dict) else {}
            return [Hello(info) if kind == HELLO else Relay(info)]
        return []  # a type this side does not know

    def _peer_opened(self, stream_id: int, payload: bytes) -> list[Event]:
        if self.opens or not self.accepts or stream_id in self.streams:
            return [Reply(frame(CLOSE, stream_id, b"this side does not accept streams"))]
        try:
            meta = json.loads(payload)
        except ValueError:
            meta = None
        stream = self.streams[stream_id] = self.new_stream(stream_id, meta if isinstance(meta, dict) else {})
        return [Opened(stream)]

    def _stream_frame(self, kind: int, stream_id: int, payload: bytes) -> list[Event]:
        stream = self.streams.get(stream_id)
        if stream is None:
            return []  # a stream closed on this side; the peer learns it from our CLOSE
        if kind == DATA:
            if stream.buffered + len(payload) > WINDOW_BYTES:
                reply = stream.close_frame(PAST_THE_WINDOW)
                self.closed(stream, PAST_THE_WINDOW)
                return [Reply(reply), Changed(stream)]
            stream.chunks.append(payload)
            stream.buffered += len(payload)
        elif kind == EOF:
            stream.eof_received = True
        elif kind == WINDOW and len(payload) == COUNT.size:
            stream.send_window += COUNT.unpack(payload)[0]
        elif kind == CLOSE:
            self.closed(stream, payload.decode(errors="replace"))
        elif kind == RESIZE:
            size = _size(payload)
            if size is None:
                return []
            stream.unheard_size = size
        else:
            return []
        return [Changed(stream)]


def _size(payload: bytes) -> tuple[int, int] | None:
    try:
        size = json.loads(payload)
        return int(size["rows"]), int(size["cols"])
    except (ValueError, KeyError, TypeError):
        return None
