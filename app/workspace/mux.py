"""The multiplex protocol: many byte streams over one websocket, spoken by the
platform and by the agent program (both run this module on gevent).

Every websocket message is one binary frame:

    +--------+----------------+-------------------------+
    | type   | stream id      | payload                 |
    | 1 byte | 4 bytes, BE    | the rest of the message |
    +--------+----------------+-------------------------+

(the websocket message gives the length; on the agent connection that websocket is
websocket.FrameTransport, frames without wsproto). Types:

    1 HELLO   stream 0, JSON. Agent -> platform first: {"version", "apps": [{"slug", "url"}]};
              the platform answers {"version", "ping_seconds", "agent_id"}. Both sides speak VERSION
              only: a HELLO with another version closes the connection with close
              code 1002 and a reason that names both versions (check_version).
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
              a client waits on the relay (relay.py) for this agent in that session;
              the agent dials /relay?role=agent&agent=<its agent_id>&session=<session>
              and serves this same protocol over that websocket (below). A peer
              ignores connection frames of a type it does not know, so an agent older
              than RELAY ignores the invitation (VERSION did not change for it).

Over a relay session the client plays the platform's part: it opens the streams
(`opens=True`), the agent serves them, with the same frames, one per binary websocket
message, which the relay forwards without reading them. Both send a HELLO
{"version"} first and check the other's. An app stream is opened by slug,
{"kind": "app", "slug"}, never by URL: the agent resolves it from its apps (those the
RELAY invitation lists, its own --app entries winning); {"kind": "pty", ...} as above.

Back-pressure: a sender with no window left waits, so a slow reader (a browser, an
app) slows its writer down instead of filling memory: the receive buffer of a stream
never holds more than WINDOW_BYTES, and a peer that sends past its window is
disconnected. The reader loop never blocks on a stream, so one slow stream never
stalls the others.

Keepalive: the platform sends a PING every `ping_seconds`; two PINGs without a PONG
close the connection. The agent closes (and reconnects) when nothing at all arrives
for three intervals.
"""
import json
import logging
import struct
import time
from collections import deque

import gevent
from gevent.event import Event
from simple_websocket import ConnectionClosed

VERSION = 2  # 2: 4 MiB windows, DATA frames up to 512 KiB (RELAY needs no new version: see above)
HELLO, OPEN, DATA, EOF, CLOSE, WINDOW, PING, PONG, RESIZE, RELAY = range(1, 11)
VERSION_REFUSED = 1002  # the websocket close code of a HELLO with another version
HEADER = struct.Struct("!BI")
COUNT = struct.Struct("!I")
# Measured with bench/workspace_apps.py: larger frames and windows cut the per-frame
# cost of bulk transfers (a 100 MB download); a stream still buffers at most a window.
MAX_DATA = 512 * 1024
WINDOW_BYTES = 4 * 1024 * 1024
# Consumed bytes are granted back in batches, not per read.
GRANT_BYTES = WINDOW_BYTES // 4
MISSED_PONGS = 2

log = logging.getLogger("bundle.workspace.mux")


class StreamClosed(Exception):
    """The stream was closed or reset before its end; `str()` says why."""


def frame(kind, stream_id, payload=b""):
    return HEADER.pack(kind, stream_id) + payload


def json_payload(value):
    return json.dumps(value, separators=(",", ":")).encode()


def version_mismatch(info, peer, me):
    """None if the peer's HELLO `info` speaks VERSION; else why not (a close reason)."""
    version = info.get("version")
    if version == VERSION:
        return None
    return f"the {peer} speaks protocol version {version!r}, the {me} version {VERSION}"


class Stream:
    """One direction pair of bytes: read()/write()/write_eof()/close()."""

    def __init__(self, mux, stream_id, meta):
        self.mux, self.id, self.meta = mux, stream_id, meta
        self._chunks = deque()
        self._buffered = 0
        self._readable = Event()
        self._eof_received = False
        self._eof_sent = False
        self.closed_reason = None
        self._send_window = WINDOW_BYTES
        self._window_open = Event()
        self._window_open.set()
        self._consumed = 0
        self.on_resize = None  # pty streams: callable(rows, cols)
        self.unheard_size = None  # the last RESIZE that came while on_resize was None

    # -- reading
    def read(self, timeout=None):
        """The next chunk of bytes; b"" at the end of the stream; None after
        `timeout`. Raises StreamClosed if the stream was cut before its end."""
        while not self._chunks:
            if self._eof_received:
                return b""
            if self.closed_reason is not None:
                raise StreamClosed(self.closed_reason)
            self._readable.clear()
            if not self._readable.wait(timeout):
                return None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        self._grant(len(chunk))
        return chunk

    def take_buffered(self):
        """What has arrived and not been read yet (b"" if nothing), without waiting."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        self._grant(len(data))
        return data

    def _grant(self, count):
        self._consumed += count
        if self._consumed >= GRANT_BYTES and self.closed_reason is None:
            self.mux.send_quietly(WINDOW, self.id, COUNT.pack(self._consumed))
            self._consumed = 0

    # -- writing
    def write(self, data):
        """Send all of `data`, waiting for window as needed."""
        view = memoryview(data)
        while view:
            while self._send_window <= 0 and self.closed_reason is None:
                self._window_open.clear()
                self._window_open.wait()
            if self.closed_reason is not None:
                raise StreamClosed(self.closed_reason)
            count = min(len(view), MAX_DATA, self._send_window)
            self._send_window -= count
            self.mux.send(DATA, self.id, view[:count])
            view = view[count:]

    def write_eof(self):
        if not self._eof_sent and self.closed_reason is None:
            self._eof_sent = True
            self.mux.send_quietly(EOF, self.id)

    def resize(self, rows, cols):
        if self.closed_reason is None:
            self.mux.send_quietly(RESIZE, self.id, json_payload({"rows": rows, "cols": cols}))

    def close(self, reason=""):
        """End the stream both ways (idempotent)."""
        if self.closed_reason is None:
            self.mux.send_quietly(CLOSE, self.id, reason.encode()[:1024])
            self._closed(reason or "closed")

    # -- frames from the peer (called by the mux's reader; never block)
    def _data(self, payload):
        if self._buffered + len(payload) > WINDOW_BYTES:
            self.close("protocol error: data past the window")
            return
        self._chunks.append(payload)
        self._buffered += len(payload)
        self._readable.set()

    def _eof(self):
        self._eof_received = True
        self._readable.set()

    def _window(self, payload):
        self._send_window += COUNT.unpack(payload)[0]
        self._window_open.set()

    def _closed(self, reason):
        if self.closed_reason is None:
            self.closed_reason = reason or "closed by the peer"
        self.mux.streams.pop(self.id, None)
        self._readable.set()
        self._window_open.set()


class Mux:
    """The multiplexer on one transport (websocket.Transport). `on_open(stream)` runs in
    a greenlet of its own for each stream the peer opens; `on_hello(dict)` for HELLO,
    `on_relay(dict)` for RELAY (it must not block)."""

    def __init__(self, transport, opens, on_open=None, on_hello=None, on_pong=None, on_relay=None):
        self.transport = transport
        self.opens = opens
        self.on_open, self.on_hello, self.on_pong, self.on_relay = on_open, on_hello, on_pong, on_relay
        self.streams = {}
        self._next_id = 1
        self.closed_reason = None
        self.last_received = time.monotonic()
        self._unanswered_pings = 0
        self._send_parts = getattr(transport, "send_parts", None)

    # -- sending
    def send(self, kind, stream_id, payload=b""):
        if self._send_parts is not None:
            self._send_parts(HEADER.pack(kind, stream_id), payload)  # one copy of the payload, not two
        else:
            self.transport.send(frame(kind, stream_id, payload))

    def send_quietly(self, kind, stream_id, payload=b""):
        """A control frame whose loss does not matter once the connection is gone."""
        try:
            self.send(kind, stream_id, payload)
        except (ConnectionClosed, OSError):
            pass

    def hello(self, info):
        self.send(HELLO, 0, json_payload({"version": VERSION, **info}))

    def invite(self, info):
        """Platform -> agent: a RELAY invitation; False when the connection is gone."""
        if self.closed_reason is not None:
            return False
        try:
            self.send(RELAY, 0, json_payload(info))
        except (ConnectionClosed, OSError):
            return False
        return True

    def open(self, meta, data=b""):
        """A new stream to the peer (only for the opening side); its first `data`, if
        any, goes in the same write as the OPEN (one wake-up of the peer, not two)."""
        if self.closed_reason is not None:
            raise StreamClosed(self.closed_reason)
        stream_id, self._next_id = self._next_id, self._next_id + 1
        stream = self.streams[stream_id] = Stream(self, stream_id, meta)
        frames = [(HEADER.pack(OPEN, stream_id), json_payload(meta))]
        first, rest = data[:MAX_DATA], data[MAX_DATA:]
        if first:
            frames.append((HEADER.pack(DATA, stream_id), first))
            stream._send_window -= len(first)
        try:
            self._send_batch(frames)
            if rest:
                stream.write(rest)
        except (ConnectionClosed, OSError) as exc:
            stream._closed(f"the connection failed: {exc}")
            raise StreamClosed(stream.closed_reason) from None
        return stream

    def _send_batch(self, frames):
        """Several frames in one write where the transport can (FrameTransport)."""
        send_batch = getattr(self.transport, "send_batch", None)
        if send_batch is not None:
            send_batch(frames)
        else:
            for prefix, payload in frames:
                self.transport.send(prefix + payload)

    # -- reading
    def run(self):
        """Read and dispatch frames until the connection ends; then every stream is
        closed. Returns the reason it ended."""
        try:
            while self.closed_reason is None:
                message = self.transport.receive()
                self.last_received = time.monotonic()
                self._dispatch(message)
        except ConnectionClosed as exc:
            self._shutdown(f"the connection closed: {exc.message}" if exc.message else "the connection closed")
        except OSError as exc:
            self._shutdown(f"the connection failed: {exc}")
        return self.closed_reason

    def _dispatch(self, message):
        if not isinstance(message, (bytes, bytearray, memoryview)) or len(message) < HEADER.size:
            self.close("protocol error: a frame must be a binary message of at least 5 bytes")
            return
        kind, stream_id = HEADER.unpack_from(message)
        payload = bytes(memoryview(message)[HEADER.size:])  # the one copy: the transport reuses its buffer
        if stream_id == 0:
            self._connection_frame(kind, payload)
        elif kind == OPEN:
            self._peer_opened(stream_id, payload)
        else:
            self._stream_frame(kind, stream_id, payload)

    def _connection_frame(self, kind, payload):
        if kind == PING:
            self.send_quietly(PONG, 0, payload)
        elif kind == PONG:
            self._unanswered_pings = 0
            if self.on_pong:
                self.on_pong()
        elif kind in (HELLO, RELAY):
            handler = self.on_hello if kind == HELLO else self.on_relay
            if handler is None:
                return
            try:
                info = json.loads(payload)
            except ValueError:
                self.close(f"protocol error: {'HELLO' if kind == HELLO else 'RELAY'} is not JSON")
                return
            handler(info if isinstance(info, dict) else {})

    def _peer_opened(self, stream_id, payload):
        if self.opens or self.on_open is None or stream_id in self.streams:
            self.send_quietly(CLOSE, stream_id, b"this side does not accept streams")
            return
        try:
            meta = json.loads(payload)
        except ValueError:
            meta = None
        stream = self.streams[stream_id] = Stream(self, stream_id, meta if isinstance(meta, dict) else {})
        gevent.spawn(self._serve, stream)

    def _serve(self, stream):
        try:
            self.on_open(stream)
        except StreamClosed:
            pass
        except Exception:
            log.exception("stream %s (%s) failed", stream.id, stream.meta.get("kind"))
        finally:
            stream.close()

    def _stream_frame(self, kind, stream_id, payload):
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream closed on this side; the peer learns it from our CLOSE
        if kind == DATA:
            stream._data(payload)
        elif kind == EOF:
            stream._eof()
        elif kind == WINDOW and len(payload) == COUNT.size:
            stream._window(payload)
        elif kind == CLOSE:
            stream._closed(payload.decode(errors="replace"))
        elif kind == RESIZE:
            self._resize(stream, payload)

    @staticmethod
    def _resize(stream, payload):
        try:
            size = json.loads(payload)
            rows, cols = int(size["rows"]), int(size["cols"])
        except (ValueError, KeyError, TypeError):
            return
        if stream.on_resize:
            stream.on_resize(rows, cols)
        else:
            stream.unheard_size = (rows, cols)

    # -- keepalive and the end
    def keepalive(self, interval):
        """The platform's side: PING every `interval` s; close after MISSED_PONGS
        PINGs without an answer. Runs until the connection ends."""
        while self.closed_reason is None:
            gevent.sleep(interval)
            if self._unanswered_pings >= MISSED_PONGS:
                self.close(f"{MISSED_PONGS} pings were not answered")
                return
            self._unanswered_pings += 1
            self.send_quietly(PING, 0, b"%d" % time.monotonic_ns())

    def watch_silence(self, limit):
        """The agent's side: close when nothing arrived for `limit` seconds."""
        while self.closed_reason is None:
            quiet = time.monotonic() - self.last_received
            if quiet >= limit:
                self.close(f"nothing received for {quiet:.0f} s")
                return
            gevent.sleep(limit - quiet)

    def close(self, reason="closed", code=1000):
        """End the connection; the peer gets `reason` in the websocket close frame."""
        if self.closed_reason is None:
            self.transport.close(code, reason)
            self._shutdown(reason)

    def _shutdown(self, reason):
        if self.closed_reason is None:
            self.closed_reason = reason
        for stream in list(self.streams.values()):
            stream._closed(self.closed_reason)
        self.transport.close()


def relay_mux(transport, opens, peer, me, on_open=None, hello=None):
    """A Mux for one end of a relay session (see above): our HELLO goes at once; the
    peer's is checked (another version closes the session with the reason) and sets
    the returned mux's `ready` Event. The caller runs mux.run()."""
    ready = Event()

    def on_hello(info):
        refused = version_mismatch(info, peer, me)
        if refused is not None:
            mux.close(refused, VERSION_REFUSED)
        else:
            ready.set()

    mux = Mux(transport, opens, on_open=on_open, on_hello=on_hello)
    mux.ready = ready
    mux.hello(hello or {})
    return mux


def join(one, other):
    """Copy bytes both ways between two streams until both directions ended: an end
    of input is passed on as a half-close, a cut as a close with its reason."""
    def copy(source, target):
        try:
            while True:
                data = source.read()
                if not data:
                    target.write_eof()
                    return
                target.write(data)
        except StreamClosed as exc:
            source.close(str(exc))
            target.close(str(exc))

    other_way = gevent.spawn(copy, other, one)
    try:
        copy(one, other)
        other_way.join()
    finally:
        other_way.kill()


def splice(stream, sock, chunk=MAX_DATA):
    """Copy bytes both ways between `stream` and a connected socket until both
    directions ended: each side's end of input is passed on as a half-close."""
    def socket_to_stream():
        buffer = bytearray(chunk)  # reused: write() has sent the bytes when it returns
        view = memoryview(buffer)
        try:
            while True:
                count = sock.recv_into(buffer)
                if not count:
                    break
                stream.write(view[:count])
            stream.write_eof()
        except (OSError, StreamClosed):
            stream.close("the connection failed")

    upward = gevent.spawn(socket_to_stream)
    try:
        while True:
            data = stream.read()
            if not data:
                break
            sock.sendall(data)
        sock.shutdown(1)  # SHUT_WR: the peer sees the end of input, may still answer
        upward.join()
    except (OSError, StreamClosed):
        stream.close("the connection failed")
    finally:
        upward.kill()
