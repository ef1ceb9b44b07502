"""A model's work as an SSE stream, through the shared helper
(app.common.sse.stream_response), which reads a broker subscription: `Feed` is
the smallest adapter from a generator of records to that interface.

The generator runs in a greenlet of its own (not a thread); it takes a database
connection only around its own queries (`database.connection_context()`), never
across a model call, so that hundreds of streams do not hold the pool. It hands its
records over a gevent queue; the response's greenlet waits on the queue, and the
helper's keepalive ticker interrupts that wait (`interrupt`), so a comment goes out
every 25 s while a model thinks. A gone client closes the feed, which kills the
greenlet and with it the provider call."""

import logging

import gevent
from gevent.queue import Empty, Queue

from app.common.broker import SubscriptionClosed
from app.common.sse import stream_response

log = logging.getLogger("bundle.notebook")
_END = object()
_WAKE = object()


class Feed:
    def __init__(self, records, on_failure):
        """`records`: an iterable of JSON-able dicts; `on_failure(exc)`: the last record
        when it raises (the stream then ends cleanly)."""
        self._queue = Queue()
        self._greenlet = gevent.spawn(self._pump, records, on_failure)

    def _pump(self, records, on_failure):
        try:
            for record in records:
                self._queue.put(record)
                gevent.sleep(0)  # the record goes out now, before the next step's work
        except Exception as exc:
            if not isinstance(exc, _EXPECTED):
                log.exception("a stream's producer failed")
            self._queue.put(on_failure(exc))
        finally:
            self._queue.put(_END)

    def get(self, timeout=None):
        try:
            item = self._queue.get(timeout=timeout)
        except Empty:
            return None
        if item is _END:
            raise SubscriptionClosed("complete")
        return None if item is _WAKE else item

    def interrupt(self):
        """The keepalive is due: the waiting `get` returns None (after the records
        queued before)."""
        self._queue.put(_WAKE)

    def close(self):
        self._greenlet.kill(block=False)


def _expected():
    from app.common.failures import Failure
    from app.notebook.llm import ProviderError

    return (Failure, ProviderError)


_EXPECTED = _expected()


def error_record(exc):
    """The `error` record of a failure: its message (as `message`, what Open Notebook's
    clients read, and `detail`, the service's error field) and status, never a traceback."""
    message = getattr(exc, "message", None) or "internal error"
    return {"type": "error", "message": message, "detail": message, "status": getattr(exc, "status", 500)}


def sse(records):
    return stream_response([], Feed(records, error_record), reconnect=False)  # one request's answer
