"""Publish/subscribe of small JSON messages by topic, for the live streams of a service.

One interface (subscribe / publish / subscriber_count / close_all, and
Subscription.get / close / SubscriptionClosed), two backends, chosen at first use:

- `Broker`, in the process (REDIS_URL unset, the embedded default): a publish reaches
  the subscribers of this process only.
- `RedisBroker` (REDIS_URL set): a publish is a Redis PUBLISH, and reaches the
  subscribers of every process of the service, this one included, in one order.

Each subscriber has a bounded queue. `publish` never waits on a subscriber: one that
falls more than `max_pending` messages behind is dropped, and its reader sees
`SubscriptionClosed` on its next `get`, so a stream ends and its client reconnects
from its own cursor (and resyncs). Call `publish` and `subscribe` from greenlets of the
worker's loop, not from threadpool threads (gevent events are not thread-safe).
Every subscriber of a process is handed the same message object, which nobody may
change after it is published (app.common.sse renders it once for all its streams).
"""
import json
import logging
from collections import defaultdict, deque

import gevent
import redis
from gevent.event import Event
from gevent.lock import Semaphore

from app.common import lifecycle, redis_client

log = logging.getLogger("bundle.broker")


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
    """In the process: a publish reaches this process's subscribers only."""
    shared = False  # a publish does not reach other processes

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

    def __init__(self, url, max_pending=1000):
        self.max_pending = max_pending
        self._url = url
        self._client = redis_client.for_url(url)
        self._prefix = f"{redis_client.PREFIX}:{redis_client.database_number(self._client)}:"
        self._topics = defaultdict(set)          # topic -> this process's subscriptions
        self._listening = {}                      # topic -> Event set once Redis confirmed its SUBSCRIBE
        self._confirmations = defaultdict(deque)  # channel -> Events of the SUBSCRIBEs sent, in their order
        self._conn = None                         # the subscriber connection, while it is up
        self._up = Event()
        self._down_reason = None                  # why it is down, once a try failed
        self._tried = Event()                     # set once the first connection attempt ended
        self._reader = None
        self._write_lock = Semaphore()
        self._closed_reason = None

    # ----------------------------------------------------------------- the interface

    def subscribe(self, topic):
        """A new subscription; closed at once (with the reason) when the broker is
        closed or Redis cannot be reached."""
        sub = Subscription(self, topic, self.max_pending)
        unavailable = self._closed_reason or self._wait_until_up()
        if unavailable:
            sub._end(unavailable)
            return sub
        self._topics[topic].add(sub)
        listening = self._listening.get(topic)
        if listening is None:
            listening = self._listening[topic] = self._send_subscribe(topic)
        if not listening.wait(redis_client.COMMAND_TIMEOUT):
            sub._end(f"live events are unavailable: Redis did not confirm the subscription"
                     f" within {redis_client.COMMAND_TIMEOUT:g} s")
        return sub

    def publish(self, topic, message):
        payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
        try:
            self._client.publish(self._prefix + topic, payload)
        except redis.RedisError as exc:
            # The change it announces is stored; streams resync when they reconnect.
            log.warning("live events: a message on %s was not published: %s", topic, redis_client.describe(exc))

    def subscriber_count(self, topic):
        """The subscribers of `topic` in this process."""
        return len(self._topics.get(topic, ()))

    def close_all(self, reason="server is stopping"):
        self._closed_reason = reason
        self._end_all(reason)
        if self._reader is not None:
            self._reader.kill(block=False)  # it disconnects on its way out

    # ----------------------------------------------------------------- the subscriber connection

    def _wait_until_up(self):
        """None once the subscriber connection is up, else why live events are unavailable.
        Only the very first connection is waited for; after a loss, the answer is at once."""
        if self._reader is None or self._reader.dead:
            self._reader = gevent.spawn(self._run)
        self._tried.wait(redis_client.CONNECT_TIMEOUT + redis_client.COMMAND_TIMEOUT)
        if self._up.is_set():
            return None
        return f"live events are unavailable: {self._down_reason or 'Redis did not answer'}"

    def _run(self):
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

    def _read(self, conn):
        while not self._closed_reason:
            if not conn.is_connected:
                # A failed write closed it; reading would reconnect it without our subscriptions.
                raise redis.ConnectionError("the connection was closed after a failed write")
            if not conn.can_read(timeout=HEARTBEAT_SECONDS):
                self._send("PING")
                if not conn.can_read(timeout=redis_client.COMMAND_TIMEOUT):
                    raise redis.TimeoutError(f"no answer to a PING within {redis_client.COMMAND_TIMEOUT:g} s")
            self._dispatch(conn.read_response())

    def _dispatch(self, reply):
        # b"PONG" or [b"pong", b""] answer the heartbeat; unsubscribe confirmations need nothing.
        if not isinstance(reply, list) or len(reply) != 3:
            return
        kind, channel, data = reply
        if kind == b"message":
            self._deliver(channel.decode("utf-8", "replace")[len(self._prefix):], data)
        elif kind == b"subscribe":
            waiting = self._confirmations.get(channel)
            if waiting:
                waiting.popleft().set()   # Redis confirms a connection's SUBSCRIBEs in their order
                if not waiting:
                    del self._confirmations[channel]

    def _deliver(self, topic, data):
        subs = self._topics.get(topic)
        if not subs:
            return
        try:
            message = json.loads(data)
        except ValueError:
            log.warning("live events: a message on %s is not JSON; dropped", topic)
            return
        for sub in list(subs):
            sub._offer(message)

    def _send_subscribe(self, topic):
        channel = (self._prefix + topic).encode("utf-8")
        confirmed = Event()
        self._confirmations[channel].append(confirmed)
        self._send("SUBSCRIBE", channel)
        return confirmed

    def _send(self, *command):
        conn = self._conn
        if conn is None:
            return
        try:
            with self._write_lock:
                conn.send_command(*command, check_health=False)
        except (redis.RedisError, OSError) as exc:
            # redis-py closed the connection: the reader notices and reconnects.
            log.warning("live events: a %s to Redis failed: %s", command[0], redis_client.describe(exc))

    def _lost(self, conn, reason, backoff):
        was_up = self._up.is_set()
        self._up.clear()
        self._conn, self._down_reason = None, reason
        conn.disconnect()
        self._tried.set()
        if self._closed_reason:
            return
        if was_up:
            streams = sum(len(subs) for subs in self._topics.values())
            log.warning("live events: the connection to Redis is lost (%s); %d open streams closed,"
                        " reconnecting in %.1f s", reason, streams, backoff)
        else:
            log.warning("live events: no connection to Redis (%s); trying again in %.1f s", reason, backoff)
        self._end_all(f"live events were interrupted: {reason}")
        for waiting in self._confirmations.values():
            for confirmed in waiting:
                confirmed.set()   # their subscriptions are closed already: let subscribe() return them
        self._confirmations.clear()
        self._listening.clear()

    def _end_all(self, reason):
        for subs in list(self._topics.values()):
            for sub in list(subs):
                sub._end(reason)

    def _forget(self, sub):
        subs = self._topics.get(sub.topic)
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        if not subs:
            del self._topics[sub.topic]
            self._listening.pop(sub.topic, None)
            if self._up.is_set():
                self._send("UNSUBSCRIBE", (self._prefix + sub.topic).encode("utf-8"))


# --------------------------------------------------------------------------- the process's broker

class ProcessBroker:
    """The broker of this process (each process runs one service): Redis when
    REDIS_URL is set, in the process otherwise. Chosen at first use, not at import,
    so that tests may build apps in-process with their own environment."""

    def __init__(self):
        self._backend = None
        self._closed_reason = None

    def backend(self):
        if self._backend is None:
            url = redis_client.configured_url()
            self._backend = RedisBroker(url) if url else Broker()
            if self._closed_reason:
                self._backend.close_all(self._closed_reason)
        return self._backend

    @property
    def shared(self):
        """True when a publish reaches the subscribers of every process (Redis)."""
        return self.backend().shared

    def subscribe(self, topic):
        return self.backend().subscribe(topic)

    def publish(self, topic, message):
        self.backend().publish(topic, message)

    def subscriber_count(self, topic):
        return self.backend().subscriber_count(topic)

    def close_all(self, reason="server is stopping"):
        self._closed_reason = reason
        if self._backend is not None:
            self._backend.close_all(reason)


broker = ProcessBroker()
lifecycle.on_stop(broker.close_all)
