"""Live delivery of a session's events to the streams open in this process.

Events appended by this process are published at once, by the session's writer.
Events appended by another gunicorn worker, and a log restored under the running
service, are heard of through inotify: the process's one inotify instance
(app.decks.logwatch) wakes the session's feed when the log is written and closed,
created, replaced or deleted, or its directory replaced, and the feed reads what is
new. Where inotify cannot watch (its instances or watches are used up, or the
system has none) the feed logs a warning and checks the file every `POLL_SECONDS`
instead.

Either way events are published strictly in seq order with no hole, so a stream
that skips seqs it already sent never skips one it has not: when a local batch
does not follow directly on what was delivered, the missing events are read from
the file first. The feed lives while anyone in this process listens: closing the
last subscription stops it and its watch. The broker is this process's own
(`broker` below), whatever the environment says: no Redis for decks.
"""

import logging
import os

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
from prometheus_client import Gauge

from app.common import lifecycle
from app.common.broker import LocalBroker
from app.common.offload import blocking
from app.decks import logwatch
from app.decks.eventlog import FileIdentity, read_new_events, scan_tail

POLL_SECONDS = 0.5
log = logging.getLogger("bundle.decks.feed")

# The deck service's streams are fed in the process, always: each worker reads the
# shared log itself (DATA_DIR is all it reads), so a REDIS_URL in its environment
# changes nothing here. Closed, like the shared broker, when the worker stops.
broker = LocalBroker()
lifecycle.on_stop(broker.close_all)

# One per session with a live feed in a worker: a session that streams in two workers counts twice.
LISTENED = Gauge(
    "bundle_decks_sessions_with_listeners",
    "Sessions with at least one open live stream, summed over the workers",
    multiprocess_mode="livesum",
)


def _baseline(path):
    """(identity, offset past the last complete line, highest seq) of the log now."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, 0, 0
    try:
        st = os.fstat(fd)
        last_seq, complete_end = scan_tail(fd, st.st_size)
        return FileIdentity.of(st), complete_end, last_seq
    finally:
        os.close(fd)


def _stat_identity(path):
    try:
        return FileIdentity.of(os.stat(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


class LiveFeed:
    """Publishes a session's new events on the broker, in seq order, while anyone
    in this process listens. `watcher`: the LogWatcher to use (this process's)."""

    def __init__(self, session_log, topic, watcher=None):
        self.log = session_log
        self.topic = topic
        self._watcher = watcher
        self._lock = Semaphore()
        self._changed = Event()
        self.watch = None  # the inotify watch of the log; None: polling
        self.stopped = False
        self._counted = False  # in LISTENED
        self.identity, self.offset, self.delivered = None, 0, 0

    @property
    def polling(self):
        return self.watch is None

    def start(self):
        LISTENED.inc()
        self._counted = True
        watcher = self._watcher or logwatch.process_watcher()
        try:
            # Watch first, then read the baseline: a change after the read is heard of.
            self.watch = watcher.watch(self.log.path, self._changed.set)
        except logwatch.Unavailable as exc:
            log.warning(
                "events that other workers append to %s are looked for every %g s instead of at once: %s",
                self.log.path,
                POLL_SECONDS,
                exc,
            )
        with self._lock:
            self.identity, self.offset, self.delivered = blocking(_baseline, self.log.path)
        if not self.stopped:
            gevent.spawn(self._follow)

    def stop(self):
        """Stop publishing and watching; the next subscriber starts a new feed."""
        if self.stopped:
            return
        self.stopped = True
        if self._counted:
            self._counted = False
            LISTENED.dec()
        if self.watch is not None:
            self.watch.cancel()
        self._changed.set()  # the follower ends
        if self.log.feed is self:
            self.log.feed = None

    def committed(self, outcome):
        """A batch this process just wrote (called by the session's writer)."""
        with self._lock:
            first = outcome.events[0]["seq"]
            if outcome.events[-1]["seq"] <= self.delivered:
                return  # already read from the file
            if first == self.delivered + 1 and outcome.start == self.offset:
                self._publish(outcome.events)
                self.offset, self.identity = outcome.identity.size, outcome.identity
            else:
                self._catch_up()

    def _publish(self, events):
        if self.stopped:
            return  # a newer feed may be publishing: never interleave with it
        for event in events:
            if event["seq"] > self.delivered:
                broker.publish(self.topic, event)
                self.delivered = event["seq"]

    def _catch_up(self):
        if _stat_identity(self.log.path) == self.identity:
            return  # nothing new (our own batch, already published, woke us)
        self.identity, events, self.offset = blocking(
            read_new_events, self.log.path, self.identity, self.offset, self.delivered
        )
        self._publish(events)

    def _follow(self):
        failing = False
        while not self.stopped:
            self._changed.wait(POLL_SECONDS if self.polling else None)
            self._changed.clear()
            if self.stopped:
                break
            if not broker.subscriber_count(self.topic):
                self.stop()
                break
            try:
                with self._lock:
                    if not self.stopped:
                        self._catch_up()
                failing = False
            except Exception:
                if not failing:
                    log.exception("reading new events of %s failed; retrying", self.log.path)
                failing = True
                gevent.sleep(POLL_SECONDS)
                self._changed.set()


class FeedSubscription:
    """A broker subscription to a session's live events. Closing it stops the
    session's feed when it was the last subscription in this process."""

    __slots__ = ("_subscription", "_log", "get", "interrupt")

    def __init__(self, subscription, session_log):
        self._subscription = subscription
        self._log = session_log
        # The broker subscription's own methods: a stream calls `get` once per event.
        self.get, self.interrupt = subscription.get, subscription.interrupt

    @property
    def closed_reason(self):
        return self._subscription.closed_reason

    def close(self):
        self._subscription.close()
        feed = self._log.feed
        if feed is not None and not broker.subscriber_count(feed.topic):
            feed.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def subscribe(session_log, topic, watcher=None):
    """A subscription to the session's live events, fed in seq order."""
    subscription = FeedSubscription(broker.subscribe(topic), session_log)
    if session_log.feed is None:
        feed = session_log.feed = LiveFeed(session_log, topic, watcher)
        try:
            feed.start()
        except BaseException:
            feed.stop()
            subscription.close()
            raise
    return subscription
