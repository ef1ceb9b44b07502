"""Server-Sent Events: one helper for every stream of the bundle.

`stream_response(replay, subscription)` answers with `text/event-stream`, no
caching and `X-Accel-Buffering: no`. It first sends the records of `replay`, then
the messages of `subscription`. Records carrying an integer sequence (`seq_of`)
are sent with `id:` and never twice: live messages at or below the last sequence
sent are skipped, so subscribing before the replay leaves no gap and no duplicate.

A keepalive comment goes out every `KEEPALIVE_SECONDS` on a fixed schedule,
whether or not events flow. A gone client is noticed on the next write: the server
raises in the write and the generator's `finally` closes the subscription.
"""
import json
import logging
import time

from flask import Response, request

from app.common.broker import SubscriptionClosed

KEEPALIVE_SECONDS = 25.0
log = logging.getLogger("bundle.sse")


def format_record(data, record_id=None, event=None):
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

    def __init__(self):
        self._entries = {}  # id(message) -> (message, record id, bytes)

    def record(self, message, record_id):
        entry = self._entries.get(id(message))
        if entry is not None and entry[0] is message and entry[1] == record_id:
            return entry[2]
        data = format_record(message, record_id)
        if len(self._entries) >= self.SIZE:
            self._entries.clear()  # the streams are on the newest messages: start over
        self._entries[id(message)] = (message, record_id, data)
        return data


_rendered = _RenderedOnce()


def comment(text):
    return f": {text}\n\n".encode()


def _records(replay, subscription, seq_of, after, keepalive, path):
    last_seq = after
    opened = time.monotonic()
    next_keepalive = opened + keepalive
    ending = "client gone"  # unless the loop below ends it otherwise
    try:
        yield comment("stream open")

        def render(message, shared=True):
            nonlocal last_seq
            seq = seq_of(message) if seq_of else None
            if seq is not None:
                if last_seq is not None and seq <= last_seq:
                    return None
                last_seq = seq
            # A live message is the broker's one object for every stream; a replay is this stream's own.
            return _rendered.record(message, seq) if shared else format_record(message, seq)

        for message in replay:
            record = render(message, shared=False)
            if record:
                yield record
        replay = None  # a long-lived stream need not keep its replay in memory
        while True:
            now = time.monotonic()
            if now >= next_keepalive:
                yield comment("keepalive")
                # Fixed schedule: the next keepalive is due 25 s after the previous one was due.
                while next_keepalive <= now:
                    next_keepalive += keepalive
            try:
                message = subscription.get(timeout=next_keepalive - now)
            except SubscriptionClosed as closed:
                ending = closed.reason
                yield comment(f"closed: {closed.reason}")
                return
            if message is not None:
                record = render(message)
                if record:
                    yield record
    finally:
        subscription.close()
        log.info("stream %s ended after %.1fs: %s", path, time.monotonic() - opened, ending)


def stream_response(replay, subscription, seq_of=None, after=None, keepalive=KEEPALIVE_SECONDS):
    """`after`: the client's cursor; records at or below it are never sent."""
    response = Response(_records(replay, subscription, seq_of, after, keepalive, request.path),
                        mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
