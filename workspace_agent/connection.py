"""The agent's side of a connection to the platform, on asyncio: a websocket client
(workspace_protocol.websocket) carrying the multiplex protocol (workspace_protocol.mux).

    link = await connect(url, {TOKEN_HEADER: token}, opens=False, on_open=serve)
    link.hello({...})
    reason = await link.closed

`Link` is an asyncio.BufferedProtocol: the event loop reads straight into the frame
reader's buffer and each received message goes through the protocol's state at
once, in the loop's callback; nothing waits there. A stream's reader and writer
(`Stream`) wait on one event that the protocol's changes set.
"""

import asyncio
import logging
import ssl
import time
from urllib.parse import urlsplit

import workspace_protocol.websocket as wire
from workspace_protocol.mux import (
    DATA,
    HEADER,
    MESSAGE_LIMIT,
    MISSED_PONGS,
    VERSION_REFUSED,
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
    version_mismatch,
)

TOKEN_HEADER = "Workspace-Session-Token"
DIAL_TIMEOUT_S = 10.0
# How long the agent waits for the answer to its upgrade: a platform in a reconnect
# storm keeps arrivals in line (up to 45 s, app.workspace.tunnel.agents) and answers
# each, accepted or refused with a Retry-After, within it (nginx waits 60 s too).
# Waiting in line beats being refused: a refused agent stays away for its
# Retry-After while the platform may idle.
UPGRADE_ANSWER_S = 60.0
# Above this many bytes queued in the socket's buffer, writers wait for it to drain.
WRITE_HIGH_WATER = 1024 * 1024

log = logging.getLogger("workspace-agent")


class Stream(StreamState):
    """One stream: await read() / write(); write_eof(), resize(), close() do not wait."""

    def __init__(self, link, stream_id, meta):
        super().__init__(stream_id, meta)
        self.link = link
        self._changed = asyncio.Event()

    async def read(self, timeout=None):
        """The next chunk; b"" at the end of the stream; None after `timeout`.
        StreamClosed if it was cut before its end."""
        while not self.chunks:
            if self.eof_received:
                return b""
            if self.closed_reason is not None:
                raise StreamClosed(self.closed_reason)
            if not await self._wait(timeout):
                return None
        chunk, grant = self.take()
        self.link.send_quietly(grant)
        return chunk

    async def write(self, data):
        """Send all of `data`, waiting for window (and for the socket) as needed."""
        view = memoryview(data)
        while view:
            await self._window()
            count = self.reserve(len(view))
            self.link.send(HEADER.pack(DATA, self.id), view[:count])
            view = view[count:]
            await self.link.writable()

    async def write_in_place(self, buffer, start, count):
        """write(buffer[start:start + count]) with no copy of the bytes: the frame is
        built around them in `buffer`, which has wire.ROOM_BEFORE free bytes before
        `start`. Afterwards the buffer may be reused only if link.holds_nothing()."""
        await self._window()
        allowed = self.reserve(count)
        self.link.send_in_place(HEADER.pack(DATA, self.id), buffer, start, allowed)
        if allowed < count:  # the window was short: the rest the usual way (a copy)
            await self.write(memoryview(buffer)[start + allowed : start + count])
        else:
            await self.link.writable()

    async def _window(self):
        """Until the peer grants some window; StreamClosed if the stream ends first."""
        while self.send_window <= 0 and self.closed_reason is None:
            await self._wait(None)
        if self.closed_reason is not None:
            raise StreamClosed(self.closed_reason)

    def write_eof(self):
        self.link.send_quietly(self.eof_frame())

    def resize(self, rows, cols):
        self.link.send_quietly(self.resize_frame(rows, cols))

    def close(self, reason=""):
        closing = self.close_frame(reason)
        if closing is not None:
            self.link.send_quietly(closing)
            self.link.forget(self, reason)

    async def _wait(self, timeout):
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def changed(self):
        self.deliver_size()
        self._changed.set()


class Link(asyncio.BufferedProtocol):
    """One websocket to the platform (or a relay) and the streams on it. `on_open`
    (a coroutine function) serves each stream the peer opens, in a task of its own;
    `on_hello(link, info)` and `on_relay(info)` are called with the peer's HELLO and
    RELAY (dicts); a HELLO may come with the upgrade's answer, before connect() returns."""

    def __init__(self, opens, on_open=None, on_hello=None, on_relay=None):
        self.protocol = Connection(
            opens, accepts=on_open is not None, new_stream=lambda stream_id, meta: Stream(self, stream_id, meta)
        )
        self.on_open, self.on_hello, self.on_relay = on_open, on_hello, on_relay
        loop = asyncio.get_running_loop()
        self.upgraded = loop.create_future()
        self.closed = loop.create_future()  # the reason the connection ended
        self.close_code = None  # the peer's, from its close frame
        self.last_received = time.monotonic()
        self.transport = None
        self._key = None
        self.masked = True  # until the platform agrees to unmasked frames (wire.UNMASKED_HEADER)
        self._answer = bytearray()  # the server's answer to the upgrade, so far
        self._frames = wire.FrameReader(expects_mask=False, max_message_size=MESSAGE_LIMIT)
        self._drained = asyncio.Event()
        self._drained.set()
        self._tasks = set()

    # -- asyncio's callbacks
    def connection_made(self, transport):
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER)

    def get_buffer(self, sizehint):
        return self._frames.space()

    def buffer_updated(self, count):
        self.last_received = time.monotonic()
        self._frames.filled(count)
        if not self.upgraded.done():
            self._handshake()
        if self.upgraded.done():
            self._process()

    def eof_received(self):
        self._shutdown("the connection was cut")
        return False

    def connection_lost(self, exc):
        self._shutdown(f"the connection failed: {exc}" if exc else "the connection closed")

    def pause_writing(self):
        self._drained.clear()

    def resume_writing(self):
        self._drained.set()

    # -- the handshake
    def start_handshake(self, host, target, headers):
        self._key = wire.new_key()
        self.transport.write(wire.upgrade_request(host, target, self._key, headers))

    def _handshake(self):
        """The server's answer arrives in the frame reader's buffer: taken out of it
        whole, the frames after it (if any) put back."""
        self._answer += self._frames.take_all()
        try:
            answer = wire.upgrade_answered(bytes(self._answer), self._key)
        except wire.HandshakeRefused as exc:
            self.upgraded.set_exception(exc)
            self.transport.close()
            return
        if answer is not None:
            fields, rest = answer
            name, value = wire.UNMASKED_HEADER
            self.masked = fields.get(name.lower()) != value
            self._frames.feed(rest)
            self.upgraded.set_result(True)

    # -- sending
    def send(self, prefix, payload=b""):
        if self.closed.done():
            raise StreamClosed(self.closed.result())
        self.transport.write(wire.encode(wire.OP_BINARY, payload, masked=self.masked, prefix=prefix))

    def send_in_place(self, prefix, buffer, start, count):
        if self.closed.done():
            raise StreamClosed(self.closed.result())
        self.transport.write(wire.frame_around(wire.OP_BINARY, buffer, start, count, self.masked, prefix))

    def holds_nothing(self):
        """Nothing waits in the transport's buffer (some Pythons keep a view of what
        could not be sent at once, not a copy)."""
        return self.transport.get_write_buffer_size() == 0

    def send_quietly(self, frame):
        if frame is not None and not self.closed.done():
            self.send(frame)

    async def writable(self):
        await self._drained.wait()

    def hello(self, info):
        self.send(hello_frame(info))

    async def open(self, meta, data=b""):
        """A new stream to the peer (the opening side only); `data` goes with the OPEN
        as far as the window allows, the rest after it."""
        if self.closed.done():
            raise StreamClosed(self.closed.result())
        stream, frames, rest = self.protocol.open(meta, data)
        for header, payload in frames:
            self.send(header, payload)
        if rest:
            await stream.write(rest)
        return stream

    def ping(self):
        self.send_quietly(self.protocol.ping(b"%d" % time.monotonic_ns()))

    def forget(self, stream, reason):
        self.protocol.closed(stream, reason)
        stream.changed()

    def close(self, reason="closed", code=1000):
        if self.closed.done():
            return
        try:
            # Only on a websocket: before the 101 (an answer that never came in time) the
            # server still reads HTTP, and would take the frame for a malformed request.
            if self.transport is not None and self.upgraded.done() and not self.upgraded.exception():
                self.transport.write(wire.encode(wire.OP_CLOSE, wire.close_body(code, reason), masked=self.masked))
        finally:
            self._shutdown(reason)

    # -- receiving
    def _process(self):
        try:
            while not self.closed.done():
                event = self._frames.next_event()
                if event is None:
                    return
                if isinstance(event, wire.Message):
                    for happening in self.protocol.receive(event.data):
                        self._handle(happening)
                elif isinstance(event, wire.Ping):
                    self.transport.write(wire.encode(wire.OP_PONG, event.payload, masked=self.masked))
                elif isinstance(event, wire.Close):
                    self.close_code = event.code
                    self.close(
                        event.reason or f"the platform closed the connection ({event.code})",
                        event.code if event.code != wire.NO_STATUS else 1000,
                    )
        except wire.Violation as exc:
            self.close(f"protocol error: {exc.why}", exc.code)

    def _handle(self, event):
        if isinstance(event, Changed):
            event.stream.changed()
        elif isinstance(event, Reply):
            self.send_quietly(event.frame)
        elif isinstance(event, Opened):
            self.spawn(self._serve(event.stream))
        elif isinstance(event, Relay):
            if self.on_relay:
                self.on_relay(event.info)
        elif isinstance(event, Hello):
            if self.on_hello:
                self.on_hello(self, event.info)
        elif isinstance(event, Broken):
            self.close(event.reason)
        elif isinstance(event, Pong):
            pass  # the protocol counted it

    def spawn(self, coroutine):
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _serve(self, stream):
        try:
            await self.on_open(stream)
        except StreamClosed:
            pass
        except Exception:
            log.exception("stream %s (%s) failed", stream.id, stream.meta.get("kind"))
        finally:
            stream.close()

    def _shutdown(self, reason):
        if self.closed.done():
            return
        self.closed.set_result(reason)
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionResetError(reason))
            self.upgraded.exception()  # connect() may have stopped waiting: no "never retrieved" warning
        for stream in list(self.protocol.streams.values()):
            self.forget(stream, reason)
        self._drained.set()
        if self.transport is not None:
            self.transport.close()

    # -- keepalive
    async def keepalive(self, interval):
        """PING every `interval` s; close after MISSED_PONGS without an answer."""
        while not self.closed.done():
            await asyncio.sleep(interval)
            if self.protocol.unanswered_pings >= MISSED_PONGS:
                self.close(f"{MISSED_PONGS} pings were not answered")
                return
            self.ping()

    async def watch_silence(self, limit):
        """Close when nothing arrived for `limit` seconds."""
        while not self.closed.done():
            quiet = time.monotonic() - self.last_received
            if quiet >= limit:
                self.close(f"nothing received for {quiet:.0f} s")
                return
            await asyncio.sleep(limit - quiet)


async def connect(
    url, headers, opens, on_open=None, on_hello=None, on_relay=None, timeout=DIAL_TIMEOUT_S, answer_timeout=None
):
    """A Link to a ws:// or wss:// `url`, upgraded; HandshakeRefused (with the HTTP
    status) when the server answers something else, OSError when it cannot be reached.
    `timeout` bounds the dial, `answer_timeout` (default: `timeout`) the upgrade's answer."""
    parts = urlsplit(url)
    secure = parts.scheme == "wss"
    loop = asyncio.get_running_loop()
    link = Link(opens, on_open, on_hello, on_relay)
    context = ssl.create_default_context() if secure else None
    try:
        await asyncio.wait_for(
            loop.create_connection(
                lambda: link,
                dial_address(parts.hostname),
                parts.port or (443 if secure else 80),
                ssl=context,
                server_hostname=parts.hostname if secure else None,
            ),
            timeout,
        )
        link.start_handshake(parts.netloc, f"{parts.path or '/'}{'?' + parts.query if parts.query else ''}", headers)
        await asyncio.wait_for(asyncio.shield(link.upgraded), answer_timeout or timeout)
    except asyncio.TimeoutError:
        link.close("no answer")  # the connection may not even be made: close() copes
        raise TimeoutError(f"no answer from {parts.netloc} in time") from None
    except BaseException:
        if link.transport is not None:
            link.transport.close()
        raise
    return link


def is_local_name(host):
    """localhost and *.localhost: loopback, as RFC 6761 has it (curl and browsers do so;
    glibc without nss-myhostname does not, and `make run` names its sites so)."""
    return host == "localhost" or host.endswith(".localhost")


def dial_address(host):
    return "127.0.0.1" if is_local_name(host) else host


async def relay_link(url, headers, opens, peer, me, on_open=None, hello=None):
    """connect() for one end of a relay session: our HELLO goes at once; the peer's
    is checked (another version closes the session) and resolves `link.ready`."""
    ready = asyncio.get_running_loop().create_future()

    def on_hello(link, info):
        refused = version_mismatch(info, peer, me)
        if refused is not None:
            link.close(refused, VERSION_REFUSED)
        elif not ready.done():
            ready.set_result(True)

    link = await connect(url, headers, opens, on_open=on_open, on_hello=on_hello)
    link.ready = ready
    link.hello(hello or {})
    return link
