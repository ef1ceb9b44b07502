"""One greenlet per process that calls callbacks on fixed schedules: the keepalives
of every open SSE stream.

A stream that armed a timer each time it waited for its next message paid for that
timer on every message it sent (a timeout object, a libev timer started and
stopped); with thousands of streams that was a visible share of a fan-out. Here a
stream registers once, and the one ticker greenlet sleeps until the earliest
schedule is due, so a stream costs a heap entry per keepalive interval, nothing per
message.

Schedules are fixed: the next call is due one interval after the previous one was
due, whenever the callback ran; a call is never early (the ticker checks the
monotonic clock, not a timer's idea of it); calls missed while the process was busy
are skipped, not bunched. Callbacks run in the ticker greenlet: they must not block.
The ticker belongs to the loop (gevent's hub) it was asked from, so its callbacks run
on that loop: one per worker, one per thread where a test runs a loop of its own.
"""

import heapq
import itertools
import logging
import time
from collections.abc import Callable

import gevent
from gevent.event import Event
from gevent.greenlet import Greenlet

log = logging.getLogger("bundle.ticker")


class Alarm:
    """A registered schedule; `cancel()` ends it."""

    __slots__ = ("due", "interval", "callback")

    def __init__(self, due: float, interval: float, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None
        self.due, self.interval, self.callback = due, interval, callback

    def cancel(self) -> None:
        # Its heap entry stays until due (it is skipped then); dropping the callback
        # frees what it refers to (a stream's subscription) at once.
        self.callback = None


class Ticker:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Alarm]] = []  # (due, tie-breaker, alarm)
        self._order = itertools.count()
        self._greenlet: Greenlet[[], None] | None = None
        # Set when an alarm due before the ticker's sleep ends is added (a new one per greenlet).
        self._earlier = Event()

    def every(self, interval: float, callback: Callable[[], object]) -> Alarm:
        """Call `callback()` every `interval` seconds from now on, until cancelled."""
        alarm = Alarm(time.monotonic() + interval, interval, callback)
        self._push(alarm)
        if self._greenlet is None:
            self._earlier = Event()
            self._greenlet = gevent.spawn(self._run)
        elif self._heap[0][2] is alarm:
            self._earlier.set()
        return alarm

    def pending(self) -> int:
        """How many schedules are live (cancelled ones not counted)."""
        return sum(1 for _, _, alarm in self._heap if alarm.callback is not None)

    def _push(self, alarm: Alarm) -> None:
        heapq.heappush(self._heap, (alarm.due, next(self._order), alarm))

    def _run(self) -> None:
        try:
            while self._heap:
                now = time.monotonic()
                due = self._heap[0][0]
                if due > now:
                    self._earlier.clear()
                    self._earlier.wait(due - now)
                    continue
                self._fire(heapq.heappop(self._heap)[2], now)
        finally:
            # An empty heap ends the greenlet; the next `every` starts another.
            self._greenlet = None

    def _fire(self, alarm: Alarm, now: float) -> None:
        callback = alarm.callback
        if callback is None:
            return
        try:
            callback()
        except Exception:  # one faulty callback must not stop every other schedule
            log.exception("a scheduled callback failed; its schedule ends")
            return
        while alarm.due <= now:  # fixed schedule; skip what a busy process missed
            alarm.due += alarm.interval
        if alarm.callback is not None:  # unless the callback cancelled it
            self._push(alarm)


def every(interval: float, callback: Callable[[], object]) -> Alarm:
    """Call `callback()` every `interval` seconds, from the calling loop's ticker."""
    return current().every(interval, callback)


def current() -> Ticker:
    """The ticker of the calling thread's gevent loop (created at first use)."""
    hub = gevent.get_hub()
    found = getattr(hub, "bundle_ticker", None)
    if found is None:
        # Our own attribute on gevent's hub: the ticker lives and dies with its loop.
        found = hub.bundle_ticker = Ticker()  # type: ignore[attr-defined]
    return found
