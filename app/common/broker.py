"""In-process publish/subscribe of small JSON messages by topic.

One bounded queue per subscriber. `publish` never blocks: a subscriber that falls
more than `max_pending` messages behind is dropped, and its reader sees
`SubscriptionClosed` on its next `get`, so a stream ends and its client reconnects
from its own cursor. Call `publish` from greenlets of the worker's loop, not from
threadpool threads (gevent events are not thread-safe).

The interface (subscribe / publish / close_all) is what a Redis backend would
implement for several workers or hosts.
"""
from collections import defaultdict, deque

from gevent.event import Event

from app.common import lifecycle


class SubscriptionClosed(Exception):
    """The subscription ended: `reason` says why (lagging, stopping, closed)."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Subscription:
    def __init__(self, broker, topic, max_pending):
        self._broker = broker
        self.topic = topic
        self._max_pending = max_pending
        self._items = deque()
        self._ready = Event()
        self.closed_reason = None

    def _offer(self, message):
        if self.closed_reason:
            return
        if len(self._items) >= self._max_pending:
            self._end("lagging: the client fell too far behind")
            return
        self._items.append(message)
        self._ready.set()

    def _end(self, reason):
        if not self.closed_reason:
            self.closed_reason = reason
            self._broker._forget(self)
            self._ready.set()

    def get(self, timeout=None):
        """The next message, or None when `timeout` seconds pass without one.
        Messages queued before a close are still handed out, then the close raises."""
        if not self._items and not self.closed_reason:
            self._ready.clear()
            self._ready.wait(timeout)
        if self._items:
            return self._items.popleft()
        if self.closed_reason:
            raise SubscriptionClosed(self.closed_reason)
        return None

    def close(self):
        self._end("closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Broker:
    def __init__(self, max_pending=1000):
        self.max_pending = max_pending
        self._topics = defaultdict(set)
        self._closed_reason = None

    def subscribe(self, topic):
        """A new subscription; once the broker is closed (the worker is stopping,
        yet still serves requests on kept-alive connections) it is closed at once."""
        sub = Subscription(self, topic, self.max_pending)
        self._topics[topic].add(sub)
        if self._closed_reason:
            sub._end(self._closed_reason)
        return sub

    def publish(self, topic, message):
        for sub in list(self._topics.get(topic, ())):
            sub._offer(message)

    def subscriber_count(self, topic):
        return len(self._topics.get(topic, ()))

    def close_all(self, reason="server is stopping"):
        self._closed_reason = reason
        for subs in list(self._topics.values()):
            for sub in list(subs):
                sub._end(reason)

    def _forget(self, sub):
        subs = self._topics.get(sub.topic)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._topics[sub.topic]


# The process's broker: each process runs one service.
broker = Broker()
lifecycle.on_stop(broker.close_all)
