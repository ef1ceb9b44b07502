"""Server-Sent Events: one helper for every stream of the bundle.

`stream_response(replay, subscription)` answers with `text/event-stream`, no
caching and `X-Accel-Buffering: no`. It first sends the records of `replay`, then
the messages of `subscription`. Records carrying an integer sequence (`seq_of`)
are sent with `id:` and never twice: live messages at or below the last sequence
sent are skipped, so subscribing before the replay leaves no gap and no duplicate.

After its opening comment a stream says `retry:`, a reconnection delay drawn
between RECONNECT_MS's bounds, so that browsers spread their reconnections.
A keepalive comment goes out every `KEEPALIVE_SECONDS` on a fixed schedule,
whether or not events flow: the process's one ticker (app.common.ticker) interrupts
the stream's wait when it is due, so no stream arms a timer per message. A gone
client is noticed on the next write: the server raises in the write and the
generator's `finally` closes the subscription.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol

from flask import Response, g, request
from prometheus_client import Gauge

from app.common import metrics, requestlog, ticker
from app.common.broker import Message, SubscriptionClosed
from app.common.logsetup import FIELDS, REQUEST_ID

# A message's sequence number (None: it has none), for the stream's `id:` lines.
SeqOf = Callable[[Message], "int | None"]


class Subscription(Protocol):
    """What a stream reads: a broker's Subscription, or anything with its three methods."""

    def get(self) -> Message:
        """The next message; None when interrupted (a keepalive is due)."""
        ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


KEEPALIVE_SECONDS = 25.0
# A browser's EventSource reconnects this long after its stream ends (SSE's `retry:`),
# drawn per stream: after a restart, every open page would otherwise come back at the
# same instant (browsers wait a fixed 3 to 5 s).
RECONNECT_MS = (1000, 5000)
log = logging.getLogger("bundle.sse")
STREAMS_OPEN = Gauge(
    "bundle_sse_streams_open", "Server-Sent Events streams open", ["service"], multiprocess_mode="livesum"
)


def format_record(data: Any, record_id: int | str | None = None, event: str | None = None) -> bytes:
    lines = []
    if record_id is not None:
        lines.append(f"id: {record_id}")
    if event:
        lines.append(f"event: {event}")
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    lines.append(f"data: {payload}")
    return ("\n".join(lines) + "\n\n").encode("utf-8")


class _RenderedOnce:
    """The record bytes of the last messages rendered, by the identity of the message:
    every stream of a worker is handed the same message object by the broker, so the
    first stream to send it renders it and the others send those same bytes. Entries
    hold their message, so an id is never reused while its entry lives."""

    SIZE = 64

    def __init__(self) -> None:
        self._entries: dict[int, tuple[Message, int | None, bytes]] = {}  # id(message) -> (message, record id, bytes)

    def record(self, message: Message, record_id: int | None) -> bytes:
        entry = self._entries.get(id(message))
        if entry is not None and entry[0] is message and entry[1] == record_id:
            return entry[2]
        data = format_record(message, record_id)
        if len(self._entries) >= self.SIZE:
            self._entries.clear()  # the streams are on the newest messages: start over
        self._entries[id(message)] = (message, record_id, data)
        return data


_rendered = _RenderedOnce()


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


KEEPALIVE = comment("keepalive")


def _replayed(
    replay: Iterable[Message], seq_of: SeqOf | None, last_seq: int | None
) -> Generator[bytes, None, int | None]:
    """The records of `replay` past `last_seq`; returns the last sequence sent."""
    for message in replay:
        seq = seq_of(message) if seq_of else None
        if seq is not None:
            if last_seq is not None and seq <= last_seq:
                continue
            last_seq = seq
        yield format_record(message, seq)  # this stream's own object: not shared
    return last_seq


def _records(
    replay: Iterable[Message],
    subscription: Subscription,
    seq_of: SeqOf | None,
    after: int | None,
    keepalive: float,
    path: str,
    route: str | None = None,
    request_id: str | None = None,
    reconnect_ms: int | None = None,
) -> Iterator[bytes]:
    """The stream's records. `path`, `route`, `request_id`: the request's, for the line
    of the stream's end, written after the request's context is gone (`path` as the
    request line shows it: requestlog.shown_request_path). `reconnect_ms`: the
    `retry:` sent after the opening comment, if any."""
    opened = time.monotonic()
    ending = "client gone"  # unless the loop below ends it otherwise
    # The process's one ticker interrupts the wait when a keepalive is due (fixed
    # schedule), so waiting for a message arms no timer of its own.
    alarm = ticker.every(keepalive, subscription.interrupt)
    streams = metrics.of_service(STREAMS_OPEN)
    streams.inc()
    try:
        yield comment("stream open")
        if reconnect_ms is not None:
            yield b"retry: %d\n\n" % reconnect_ms
        last_seq = yield from _replayed(replay, seq_of, after)
        del replay  # a long-lived stream need not keep its replay in memory
        get, record = subscription.get, _rendered.record
        while True:
            try:
                message = get()
            except SubscriptionClosed as closed:
                ending = closed.reason
                yield comment(f"closed: {closed.reason}")
                return
            if message is None:  # interrupted: the keepalive is due
                yield KEEPALIVE
                continue
            # Inline, not shared with _replayed: this runs per message and stream.
            seq = seq_of(message) if seq_of else None
            if seq is not None:
                if last_seq is not None and seq <= last_seq:
                    continue  # sent already (by the replay)
                last_seq = seq
            # The broker's one object for every stream: rendered once per process.
            yield record(message, seq)
    finally:
        streams.dec()
        alarm.cancel()
        subscription.close()
        seconds = time.monotonic() - opened
        log.info(
            "stream %s ended after %.1fs: %s",
            path,
            seconds,
            ending,
            extra={
                FIELDS: {
                    "message": f"stream {route or '-'} ended after {seconds:.1f}s: {ending}",
                    "route": route,
                    "duration_ms": round(seconds * 1000, 1),
                    "ending": ending,
                },
                REQUEST_ID: request_id,
            },
        )


def stream_response(
    replay: Iterable[Message],
    subscription: Subscription,
    seq_of: SeqOf | None = None,
    after: int | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
    reconnect: bool = True,
) -> Response:
    """`after`: the client's cursor; records at or below it are never sent.
    `subscription`: a broker subscription, or anything with its `get()` (None when
    interrupted), `interrupt()` and `close()`. `reconnect`: a stream a browser's
    EventSource comes back to (a `retry:` is sent), not one request's answer."""
    rule = request.url_rule
    records = _records(
        replay,
        subscription,
        seq_of,
        after,
        keepalive,
        requestlog.shown_request_path(),
        None if rule is None else rule.rule,
        g.get("request_id"),
        random.randint(*RECONNECT_MS) if reconnect else None,
    )
    response = Response(records, mimetype="text/event-stream")
    # The records are bytes already: the server iterates the generator itself, without
    # werkzeug's encoding and closing layers around each record (the server closes it).
    response.direct_passthrough = True
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
