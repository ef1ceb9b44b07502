"""The platform's driver of the multiplex protocol (workspace_protocol/mux.py, where
the protocol is described), on gevent: a greenlet reads the connection and feeds the
protocol's state; streams wait on gevent events for data and for window. The reader
never blocks on a stream, so one slow stream never stalls the others. Also used
between the platform's own workers (mesh.py).
"""

import logging
import time

import gevent
from gevent.event import Event
from prometheus_client import Counter
from simple_websocket import ConnectionClosed

from workspace_protocol.mux import (
    DATA,
    HEADER,
    MAX_DATA,
    MISSED_PONGS,
    Broken,
    Changed,
    Connection,
    Hello,
    Opened,
    Pong,
    Relay,
    Reply,
    StreamClosed,
    StreamState,
    hello_frame,
    relay_frame,
)

log = logging.getLogger("bundle.workspace.mux")

# The streams' bytes on agents' connections (a Mux made with tunnel=True), not the
# mesh's between workers nor the protocol's own frames.
TUNNEL_BYTES = Counter(
    "bundle_workspace_tunnel_bytes_total",
    "Bytes of the streams carried on agents' connections, by direction (to_agent, from_agent)",
    ["direction"],
)
_TO_AGENT, _FROM_AGENT = TUNNEL_BYTES.labels("to_agent"), TUNNEL_BYTES.labels("from_agent")


class Stream(StreamState):
    """One direction pair of bytes: read()/write()/write_eof()/close()."""

    def __init__(self, mux, stream_id, meta):
        super().__init__(stream_id, meta)
        self.mux = mux
        self._readable = Event()
        self._window_open = Event()
        self._window_open.set()

    # -- reading
    def read(self, timeout=None):
        """The next chunk of bytes; b"" at the end of the stream; None after
        `timeout`. Raises StreamClosed if the stream was cut before its end."""
        while not self.chunks:
            if self.eof_received:
                return b""
            if self.closed_reason is not None:
                raise StreamClosed(self.closed_reason)
            self._readable.clear()
            if not self._readable.wait(timeout):
                return None
        chunk, grant = self.take()
        self.mux.send_quietly(grant)
        if self.mux.counts_bytes:
            _FROM_AGENT.inc(len(chunk))
        return chunk

    def take_buffered(self):
        """What has arrived and not been read yet (b"" if nothing), without waiting."""
        data, grant = self.take_all()
        self.mux.send_quietly(grant)
        if self.mux.counts_bytes and data:
            _FROM_AGENT.inc(len(data))
        return data

    # -- writing
    def write(self, data):
        """Send all of `data`, waiting for window as needed."""
        view = memoryview(data)
        while view:
            while self.send_window <= 0 and self.closed_reason is None:
                self._window_open.clear()
                self._window_open.wait()
            if self.closed_reason is not None:
                raise StreamClosed(self.closed_reason)
            count = self.reserve(len(view))
            self.mux.send_data(self.id, view[:count])
            if self.mux.counts_bytes:
                _TO_AGENT.inc(count)
            view = view[count:]

    def write_eof(self):
        self.mux.send_quietly(self.eof_frame())

    def resize(self, rows, cols):
        self.mux.send_quietly(self.resize_frame(rows, cols))

    def close(self, reason=""):
        """End the stream both ways (idempotent)."""
        closing = self.close_frame(reason)
        if closing is not None:
            self.mux.send_quietly(closing)
            self.mux.forget(self, reason)

    # -- from the reader (never blocks)
    def changed(self):
        self.deliver_size()
        self._readable.set()
        if self.send_window > 0 or self.closed_reason is not None:
            self._window_open.set()


class Mux:
    """The multiplexer on one transport (websocket.Transport or FrameTransport).
    `on_open(stream)` runs in a greenlet of its own for each stream the peer opens;
    `on_hello(dict)` for HELLO, `on_relay(dict)` for RELAY (it must not block).
    `tunnel`: an agent's connection, whose streams' bytes count in TUNNEL_BYTES."""

    def __init__(self, transport, opens, on_open=None, on_hello=None, on_pong=None, on_relay=None, tunnel=False):
        self.transport = transport
        self.protocol = Connection(
            opens, accepts=on_open is not None, new_stream=lambda stream_id, meta: Stream(self, stream_id, meta)
        )
        self.on_open, self.on_hello, self.on_pong, self.on_relay = on_open, on_hello, on_pong, on_relay
        self.counts_bytes = tunnel
        self.closed_reason = None
        self.last_received = time.monotonic()
        self._send_parts = getattr(transport, "send_parts", None)

    @property
    def streams(self):
        return self.protocol.streams

    # -- sending
    def send_data(self, stream_id, payload):
        if self._send_parts is not None:
            self._send_parts(HEADER.pack(DATA, stream_id), payload)  # one copy of the payload, not two
        else:
            self.transport.send(HEADER.pack(DATA, stream_id) + bytes(payload))

    def send_quietly(self, data):
        """A control frame (None: nothing to send) whose loss does not matter once the
        connection is gone."""
        if data is None:
            return
        try:
            self.transport.send(data)
        except (ConnectionClosed, OSError):
            pass

    def hello(self, info):
        self.transport.send(hello_frame(info))

    def invite(self, info):
        """Platform -> agent: a RELAY invitation; False when the connection is gone."""
        if self.closed_reason is not None:
            return False
        try:
            self.transport.send(relay_frame(info))
        except (ConnectionClosed, OSError):
            return False
        return True

    def open(self, meta, data=b""):
        """A new stream to the peer (only for the opening side); its first `data`, if
        any, goes in the same write as the OPEN (one wake-up of the peer, not two)."""
        if self.closed_reason is not None:
            raise StreamClosed(self.closed_reason)
        stream, frames, rest = self.protocol.open(meta, data)
        try:
            self._send_batch(frames)
            if self.counts_bytes:
                _TO_AGENT.inc(len(data) - len(rest))
            if rest:
                stream.write(rest)
        except (ConnectionClosed, OSError) as exc:
            self.forget(stream, f"the connection failed: {exc}")
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

    def forget(self, stream, reason):
        self.protocol.closed(stream, reason)
        stream.changed()

    # -- reading
    def run(self):
        """Read and dispatch frames until the connection ends; then every stream is
        closed. Returns the reason it ended."""
        try:
            while self.closed_reason is None:
                message = self.transport.receive()
                self.last_received = time.monotonic()
                for event in self.protocol.receive(message):
                    self._handle(event)
        except ConnectionClosed as exc:
            self._shutdown(f"the connection closed: {exc.message}" if exc.message else "the connection closed")
        except OSError as exc:
            self._shutdown(f"the connection failed: {exc}")
        return self.closed_reason

    def _handle(self, event):
        if isinstance(event, Changed):
            event.stream.changed()
        elif isinstance(event, Reply):
            self.send_quietly(event.frame)
        elif isinstance(event, Opened):
            gevent.spawn(self._serve, event.stream)
        elif isinstance(event, Pong):
            if self.on_pong:
                self.on_pong()
        elif isinstance(event, Relay):
            if self.on_relay:
                self.on_relay(event.info)
        elif isinstance(event, Hello):
            if self.on_hello:
                self.on_hello(event.info)
        elif isinstance(event, Broken):
            self.close(event.reason)

    def _serve(self, stream):
        try:
            self.on_open(stream)
        except StreamClosed:
            pass
        except Exception:
            log.exception("stream %s (%s) failed", stream.id, stream.meta.get("kind"))
        finally:
            stream.close()

    # -- keepalive and the end
    def keepalive(self, interval):
        """The platform's side: PING every `interval` s; close after MISSED_PONGS
        PINGs without an answer. Runs until the connection ends."""
        while self.closed_reason is None:
            gevent.sleep(interval)
            if self.protocol.unanswered_pings >= MISSED_PONGS:
                self.close(f"{MISSED_PONGS} pings were not answered")
                return
            self.send_quietly(self.protocol.ping(b"%d" % time.monotonic_ns()))
            trim = getattr(self.transport, "trim", None)  # FrameTransport's
            if trim is not None:
                trim()

    def watch_silence(self, limit):
        """Close when nothing arrived for `limit` seconds."""
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
            self.forget(stream, self.closed_reason)
        self.transport.close()


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
