"""Publish/subscribe of small JSON messages by topic, for the live streams of a service.

One interface (`Broker`: subscribe / publish / subscriber_count / close_all, and
Subscription.get / interrupt / close / SubscriptionClosed), two backends, chosen at
first use by the process's `broker` (a ProcessBroker):

- `LocalBroker`, in the process (REDIS_URL unset, the embedded default): a publish
  reaches the subscribers of this process only.
- `RedisBroker` (REDIS_URL set): a publish is a Redis PUBLISH, and reaches the
  subscribers of every process of the service, this one included, in one order.

Each subscriber may fall `max_pending` messages behind. `publish` never waits on a
subscriber: one that falls further behind is dropped, and its reader sees
`SubscriptionClosed` on its next `get` (after the messages it was still owed), so a
stream ends and its client reconnects from its own cursor (and resyncs). Call
`publish` and `subscribe` from greenlets of the worker's loop, not from threadpool
threads (the wake-ups go through the loop's callbacks, which are not thread-safe).
Every subscriber of a process is handed the same message object, which nobody may
change after it is published (app.common.sse renders it once for all its streams).

Delivery in a process is built for one message reaching thousands of streams: the
message is stored once per topic (each subscriber keeps only its position), and the
subscribers waiting for it are woken by one loop callback that switches to each in
turn, instead of one event, one callback and one timer per subscriber and message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from itertools import islice
from typing import Any, Protocol, Union

import gevent
import redis
from gevent.event import Event
from gevent.greenlet import Greenlet
from gevent.lock import Semaphore
from greenlet import greenlet
from prometheus_client import Counter
from redis.connection import ConnectionInterface

from app.common import lifecycle, metrics, redis_client

log = logging.getLogger("bundle.broker")

LAGGING = "lagging: the client fell too far behind"
# A topic stores at least this many messages before it looks for its slowest reader
# to forget what everyone has read: the look is over all its subscribers, so it is
# made once per so many messages, never per message.
SCAN_AT_LEAST = 16
_NOTHING: Any = object()
PUBLISHES = Counter(
    "bundle_broker_publishes_total",
    "Messages published on the live-events broker (backend: local, in the process; redis)",
    ["service", "backend"],
)
PUBLISH_FAILURES = Counter(
    "bundle_broker_publish_failures_total", "Publishes that Redis did not take (logged; streams resync)", ["service"]
)
DELIVERIES = Counter(
    "bundle_broker_deliveries_total",
    "Messages handed to this process's subscribers (one per subscriber and message)",
    ["service"],
)
LAGGING_ENDED = Counter(
    "bundle_broker_subscribers_lagging_total",
    "Subscriptions ended for falling too far behind (their streams end; clients reconnect and resync)",
    ["service"],
)
# A message: a small JSON value (a dict, mostly), shared by every subscriber of a
# process and never changed after it is published.
Message = Any


class Broker(Protocol):
    """What both backends, and the process's `broker`, offer."""

    @property
    def shared(self) -> bool:
        """True when a publish reaches the subscribers of every process."""
        ...

    def subscribe(self, topic: str) -> Subscription: ...

    def publish(self, topic: str, message: Message) -> None: ...

    def subscriber_count(self, topic: str) -> int:
        """The subscribers of `topic` in this process."""
        ...

    def close_all(self, reason: str = ...) -> None:
        """Close every subscription, and every later one at once (the worker is stopping)."""
        ...


# The backends a Subscription belongs to (it calls their `_forget`).
_Backend = Union["LocalBroker", "RedisBroker"]


class SubscriptionClosed(Exception):
    """The subscription ended: `reason` says why (lagging, stopping, closed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Subscription:
    # Slots: thousands are open at once, one per stream.
    __slots__ = ("_broker", "topic", "_topic", "_cursor", "_owed", "_waiter", "_interrupted", "closed_reason")

    def __init__(self, broker: _Backend, topic: str) -> None:
        self._broker = broker
        self.topic = topic
        self._topic: _Topic | None = None  # the _Topic it reads, while subscribed
        self._cursor = 0  # how many of the topic's messages it has read
        self._owed: deque[Message] | None = None  # the messages it had not read when it ended
        self._waiter: greenlet | None = None  # its greenlet, while it waits in `get`
        self._interrupted = False
        self.closed_reason: str | None = None

    def get(self, timeout: float | None = None) -> Message:
        """The next message; None when `timeout` seconds pass without one, or when
        `interrupt()` woke the wait. Messages owed at a close are still handed out,
        then the close raises. One reader (greenlet) per subscription."""
        deadline: float | None = None
        while True:
            message = self._take()
            if message is not _NOTHING:
                return message
            if self.closed_reason:
                raise SubscriptionClosed(self.closed_reason)
            if self._interrupted:
                self._interrupted = False
                return None
            if timeout is None:
                self._sleep(None)
                continue
            now = time.monotonic()
            deadline = now + timeout if deadline is None else deadline
            if now >= deadline:
                return None
            self._sleep(deadline - now)

    def interrupt(self) -> None:
        """Make the waiting `get`, or the next one, return None once it has no message
        to hand out (a stream's keepalive is due): one wake-up, no timer per `get`."""
        self._interrupted = True
        self._wake()

    def close(self) -> None:
        self._end("closed")

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self) -> Message:
        topic = self._topic
        if topic is not None:
            unread = topic.published - self._cursor
            if unread:
                self._cursor += 1
                return topic.log[-unread]  # the log holds at least every unread message
        elif self._owed:
            return self._owed.popleft()
        return _NOTHING

    def _sleep(self, timeout: float | None) -> None:
        topic = self._topic
        if topic is not None:
            topic.sleepers[self] = None  # once, however often it waits before the next message
        self._waiter = gevent.getcurrent()
        try:
            if timeout is None:
                gevent.get_hub().switch()
            else:
                # False: the timeout ends the block silently (typeshed's stub omits it).
                with gevent.Timeout(timeout, False):  # type: ignore[arg-type]
                    gevent.get_hub().switch()
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None:
            gevent.get_hub().loop.run_callback(_wake_all, (self,))

    def _end(self, reason: str) -> None:
        if self.closed_reason:
            return
        self.closed_reason = reason
        topic = self._topic
        if topic is not None:
            unread = topic.published - self._cursor
            if unread:
                self._owed = deque(islice(topic.log, len(topic.log) - unread, None))
            # Not left listed: a topic without messages would keep its ended subscriptions.
            topic.sleepers.pop(self, None)
            self._topic = None
        self._broker._forget(self)
        self._wake()


def _wake_all(sleepers: Iterable[Subscription]) -> None:
    """In the loop: switch to each subscription still waiting, in turn (each runs until
    it waits again, on its socket or its next message), as gevent's own Event does."""
    for sub in sleepers:
        waiter = sub._waiter
        if waiter is not None:
            sub._waiter = None
            try:
                waiter.switch()
            except BaseException:  # the others must still be woken
                gevent.get_hub().handle_error(waiter, *sys.exc_info())


class _Topic:
    """One topic's subscriptions in this process, and the messages some of them have
    not read yet (`log`, the newest last; `published` counts every message)."""

    __slots__ = ("subs", "log", "published", "scan_at", "sleepers")

    def __init__(self, scan_at: int) -> None:
        self.subs: set[Subscription] = set()
        self.log: deque[Message] = deque()
        self.published = 0
        self.scan_at = scan_at
        # subscriptions to wake at the next message (a dict: ordered, O(1) removal)
        self.sleepers: dict[Subscription, None] = {}


class _LocalTopics:
    """The subscriptions of this process by topic, and delivering a message to them:
    what both backends do once a message reaches the process."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._topics: dict[str, _Topic] = {}

    def add(self, sub: Subscription) -> None:
        topic = self._topics.get(sub.topic)
        if topic is None:
            topic = self._topics[sub.topic] = _Topic(min(SCAN_AT_LEAST, self.max_pending))
        topic.subs.add(sub)
        sub._topic, sub._cursor = topic, topic.published

    def remove(self, sub: Subscription) -> bool:
        """True when `sub` was its topic's last subscription here."""
        topic = self._topics.get(sub.topic)
        if topic is None or sub not in topic.subs:
            return False
        topic.subs.discard(sub)
        if topic.subs:
            return False
        del self._topics[sub.topic]
        return True

    def deliver(self, name: str, message: Message) -> None:
        topic = self._topics.get(name)
        if topic is None:
            return
        if len(topic.log) >= topic.scan_at:
            self._trim(topic)
        topic.log.append(message)
        topic.published += 1
        metrics.of_service(DELIVERIES).inc(len(topic.subs))
        if topic.sleepers:
            sleepers, topic.sleepers = topic.sleepers, {}
            gevent.get_hub().loop.run_callback(_wake_all, sleepers)

    def _trim(self, topic: _Topic) -> None:
        """End the subscriptions `max_pending` messages behind (they keep what they are
        owed), forget what all the others have read, and look again once the log has
        doubled: the look costs one step per subscription, a few times per topic."""
        behind = 0
        for sub in list(topic.subs):
            unread = topic.published - sub._cursor
            if unread >= self.max_pending:
                sub._end(LAGGING)
                metrics.of_service(LAGGING_ENDED).inc()
            else:
                behind = max(behind, unread)
        for _ in range(len(topic.log) - behind):
            topic.log.popleft()
        topic.scan_at = min(self.max_pending, max(SCAN_AT_LEAST, 2 * behind))

    def count(self, name: str) -> int:
        topic = self._topics.get(name)
        return len(topic.subs) if topic is not None else 0

    def total(self) -> int:
        return sum(len(topic.subs) for topic in self._topics.values())

    def end_all(self, reason: str) -> None:
        for topic in list(self._topics.values()):
            for sub in list(topic.subs):
                sub._end(reason)


class LocalBroker:
    """In the process: a publish reaches this process's subscribers only."""

    shared = False  # a publish does not reach other processes

    def __init__(self, max_pending: int = 1000) -> None:
        self.max_pending = max_pending
        self._local = _LocalTopics(max_pending)
        self._closed_reason: str | None = None

    def subscribe(self, topic: str) -> Subscription:
        """A new subscription; once the broker is closed (the worker is stopping,
        yet still serves requests on kept-alive connections) it is closed at once."""
        sub = Subscription(self, topic)
        self._local.add(sub)
        if self._closed_reason:
            sub._end(self._closed_reason)
        return sub

    def publish(self, topic: str, message: Message) -> None:
        metrics.of_service(PUBLISHES, "local").inc()
        self._local.deliver(topic, message)

    def subscriber_count(self, topic: str) -> int:
        return self._local.count(topic)

    def close_all(self, reason: str = "server is stopping") -> None:
        self._closed_reason = reason
        self._local.end_all(reason)

    def _forget(self, sub: Subscription) -> None:
        self._local.remove(sub)


# --------------------------------------------------------------------------- Redis

# The subscriber connection is checked with a PING when it stayed silent this long,
# so a peer gone without a word (a cut network) is noticed too.
HEARTBEAT_SECONDS = 15.0
# Reconnecting after a loss: the first try at once-ish, then doubling up to the cap.
FIRST_BACKOFF, MAX_BACKOFF = 0.2, 5.0


class RedisBroker:
    """Through Redis: `publish` is a PUBLISH on the channel `bundle:<db>:<topic>`
    (Redis channels ignore the database number; the prefix keeps deployments that
    share a server by database apart); every process, this one included, hears it.

    Each process holds ONE subscriber connection, read by one greenlet that feeds the
    local subscriptions' queues. A topic is SUBSCRIBEd while this process has local
    subscribers of it, and `subscribe` returns once Redis confirmed it, so nothing
    published after `subscribe` returned is missed (streams subscribe before their
    snapshot). When the connection is lost every local subscription closes with the
    reason (their clients reconnect and resync), new ones close at once until the
    reader has reconnected (with backoff), and a failed publish is logged, never
    raised: the write it announces is already committed."""

    shared = True  # a publish reaches the subscribers of every process

    def __init__(self, url: str, max_pending: int = 1000) -> None:
        self.max_pending = max_pending
        self._url = url
        self._client = redis_client.for_url(url)
        self._prefix = f"{redis_client.PREFIX}:{redis_client.database_number(self._client)}:"
        self._local = _LocalTopics(max_pending)  # this process's subscriptions
        # topic -> Event set once Redis confirmed its SUBSCRIBE
        self._listening: dict[str, Event] = {}
        # channel -> Events of the SUBSCRIBEs sent, in their order
        self._confirmations: defaultdict[bytes, deque[Event]] = defaultdict(deque)
        self._conn: ConnectionInterface | None = None  # the subscriber connection, while it is up
        self._up = Event()
        self._down_reason: str | None = None  # why it is down, once a try failed
        self._tried = Event()  # set once the first connection attempt ended
        self._reader: Greenlet[[], None] | None = None
        self._write_lock = Semaphore()
        self._closed_reason: str | None = None

    # ----------------------------------------------------------------- the interface

    def subscribe(self, topic: str) -> Subscription:
        """A new subscription; closed at once (with the reason) when the broker is
        closed or Redis cannot be reached."""
        sub = Subscription(self, topic)
        unavailable = self._closed_reason or self._wait_until_up()
        if unavailable:
            sub._end(unavailable)
            return sub
        self._local.add(sub)
        listening = self._listening.get(topic)
        if listening is None:
            listening = self._listening[topic] = self._send_subscribe(topic)
        if not listening.wait(redis_client.COMMAND_TIMEOUT):
            sub._end(
                f"live events are unavailable: Redis did not confirm the subscription"
                f" within {redis_client.COMMAND_TIMEOUT:g} s"
            )
        return sub

    def publish(self, topic: str, message: Message) -> None:
        payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
        metrics.of_service(PUBLISHES, "redis").inc()
        try:
            self._client.publish(self._prefix + topic, payload)
        except redis.RedisError as exc:
            metrics.of_service(PUBLISH_FAILURES).inc()
            # The change it announces is stored; streams resync when they reconnect.
            log.warning("live events: a message on %s was not published: %s", topic, redis_client.describe(exc))

    def subscriber_count(self, topic: str) -> int:
        """The subscribers of `topic` in this process."""
        return self._local.count(topic)

    def close_all(self, reason: str = "server is stopping") -> None:
        self._closed_reason = reason
        self._end_all(reason)
        if self._reader is not None:
            self._reader.kill(block=False)  # it disconnects on its way out

    # ----------------------------------------------------------------- the subscriber connection

    def _wait_until_up(self) -> str | None:
        """None once the subscriber connection is up, else why live events are unavailable.
        Only the very first connection is waited for; after a loss, the answer is at once."""
        if self._reader is None or self._reader.dead:
            self._reader = gevent.spawn(self._run)
        self._tried.wait(redis_client.CONNECT_TIMEOUT + redis_client.COMMAND_TIMEOUT)
        if self._up.is_set():
            return None
        return f"live events are unavailable: {self._down_reason or 'Redis did not answer'}"

    def _run(self) -> None:
        backoff = FIRST_BACKOFF
        while not self._closed_reason:
            conn = redis_client.subscriber_connection(self._url)
            try:
                conn.connect()
                self._conn, self._down_reason = conn, None
                self._up.set()
                self._tried.set()
                backoff = FIRST_BACKOFF
                log.info("live events: subscribed through Redis")
                self._read(conn)
            # ValueError: redis-py reading a buffer that a failed write closed meanwhile.
            except (redis.RedisError, OSError, ValueError) as exc:
                self._lost(conn, redis_client.describe(exc), backoff)
            except Exception:  # the reader must outlive any surprise, and say so
                log.exception("live events: the Redis reader failed")
                self._lost(conn, "the Redis reader failed", backoff)
            finally:
                conn.disconnect()  # killed by close_all too
            gevent.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _read(self, conn: ConnectionInterface) -> None:
        while not self._closed_reason:
            if not conn.is_connected:
                # A failed write closed it; reading would reconnect it without our subscriptions.
                raise redis.ConnectionError("the connection was closed after a failed write")
            if not conn.can_read(timeout=HEARTBEAT_SECONDS):
                self._send("PING")
                if not conn.can_read(timeout=redis_client.COMMAND_TIMEOUT):
                    raise redis.TimeoutError(f"no answer to a PING within {redis_client.COMMAND_TIMEOUT:g} s")
            self._dispatch(conn.read_response())

    def _dispatch(self, reply: object) -> None:
        # b"PONG" or [b"pong", b""] answer the heartbeat; unsubscribe confirmations need nothing.
        if not isinstance(reply, list) or len(reply) != 3:
            return
        kind, channel, data = reply
        if kind == b"message":
            self._deliver(channel.decode("utf-8", "replace")[len(self._prefix) :], data)
        elif kind == b"subscribe":
            waiting = self._confirmations.get(channel)
            if waiting:
                waiting.popleft().set()  # Redis confirms a connection's SUBSCRIBEs in their order
                if not waiting:
                    del self._confirmations[channel]

    def _deliver(self, topic: str, data: bytes) -> None:
        if not self._local.count(topic):
            return
        try:
            message = json.loads(data)
        except ValueError:
            log.warning("live events: a message on %s is not JSON; dropped", topic)
            return
        self._local.deliver(topic, message)

    def _send_subscribe(self, topic: str) -> Event:
        channel = (self._prefix + topic).encode("utf-8")
        confirmed = Event()
        self._confirmations[channel].append(confirmed)
        self._send("SUBSCRIBE", channel)
        return confirmed

    def _send(self, *command: str | bytes) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with self._write_lock:
                conn.send_command(*command, check_health=False)
        except (redis.RedisError, OSError) as exc:
            # redis-py closed the connection: the reader notices and reconnects.
            log.warning("live events: a %s to Redis failed: %s", command[0], redis_client.describe(exc))

    def _lost(self, conn: ConnectionInterface, reason: str, backoff: float) -> None:
        was_up = self._up.is_set()
        self._up.clear()
        self._conn, self._down_reason = None, reason
        conn.disconnect()
        self._tried.set()
        if self._closed_reason:
            return
        if was_up:
            streams = self._local.total()
            log.warning(
                "live events: the connection to Redis is lost (%s); %d open streams closed, reconnecting in %.1f s",
                reason,
                streams,
                backoff,
            )
        else:
            log.warning("live events: no connection to Redis (%s); trying again in %.1f s", reason, backoff)
        self._end_all(f"live events were interrupted: {reason}")
        for waiting in self._confirmations.values():
            for confirmed in waiting:
                confirmed.set()  # their subscriptions are closed already: let subscribe() return them
        self._confirmations.clear()
        self._listening.clear()

    def _end_all(self, reason: str) -> None:
        self._local.end_all(reason)

    def _forget(self, sub: Subscription) -> None:
        if not self._local.remove(sub):
            return
        self._listening.pop(sub.topic, None)
        if self._up.is_set():
            self._send("UNSUBSCRIBE", (self._prefix + sub.topic).encode("utf-8"))


# --------------------------------------------------------------------------- the process's broker


class ProcessBroker:
    """The broker of this process (each process runs one service): Redis when
    REDIS_URL is set, in the process otherwise. Chosen at first use, not at import,
    so that tests may build apps in-process with their own environment."""

    def __init__(self) -> None:
        self._backend: Broker | None = None
        self._closed_reason: str | None = None

    def backend(self) -> Broker:
        if self._backend is None:
            url = redis_client.configured_url()
            self._backend = RedisBroker(url) if url else LocalBroker()
            if self._closed_reason:
                self._backend.close_all(self._closed_reason)
        return self._backend

    @property
    def shared(self) -> bool:
        """True when a publish reaches the subscribers of every process (Redis)."""
        return self.backend().shared

    def subscribe(self, topic: str) -> Subscription:
        return self.backend().subscribe(topic)

    def publish(self, topic: str, message: Message) -> None:
        self.backend().publish(topic, message)

    def subscriber_count(self, topic: str) -> int:
        return self.backend().subscriber_count(topic)

    def close_all(self, reason: str = "server is stopping") -> None:
        self._closed_reason = reason
        if self._backend is not None:
            self._backend.close_all(reason)


broker = ProcessBroker()
lifecycle.on_stop(broker.close_all)
