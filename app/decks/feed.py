"""Live delivery of a session's events to the streams open in this process.

Events appended by this process are published at once. Events appended by another
gunicorn worker are found by tailing the log: while anyone here listens, one
watcher greenlet per session checks the file's identity every `POLL_SECONDS` and
reads what is new. Either way events are published strictly in seq order with no
hole, so a stream that skips seqs it already sent never skips one it has not: when
a local batch does not follow directly on what was delivered, the missing events
are read from the file first.
"""
import os

import gevent
from gevent.lock import Semaphore

from app.common.broker import broker
from app.common.offload import blocking
from app.decks.eventlog import FileIdentity, read_complete_events, scan_tail

POLL_SECONDS = 0.5


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
    except FileNotFoundError:
        return None


class LiveFeed:
    def __init__(self, session_log, topic):
        self.log = session_log
        self.topic = topic
        self._lock = Semaphore()
        self.identity, self.offset, self.delivered = None, 0, 0

    def start(self):
        with self._lock:
            self.identity, self.offset, self.delivered = blocking(_baseline, self.log.path)
        gevent.spawn(self._watch)

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
        for event in events:
            if event["seq"] > self.delivered:
                broker.publish(self.topic, event)
                self.delivered = event["seq"]

    def _catch_up(self):
        identity = _stat_identity(self.log.path)
        if identity is None:
            return
        if (self.identity is None or (identity.dev, identity.ino) != (self.identity.dev, self.identity.ino)
                or identity.size < self.offset):
            self.offset = 0  # a new or rewritten file (a restore): read it whole
        events, self.offset = blocking(read_complete_events, self.log.path, self.offset)
        self.identity = identity
        self._publish(events)

    def _watch(self):
        try:
            while broker.subscriber_count(self.topic):
                gevent.sleep(POLL_SECONDS)
                if _stat_identity(self.log.path) != self.identity:
                    with self._lock:
                        self._catch_up()
        finally:
            if self.log.feed is self:
                self.log.feed = None


def subscribe(session_log, topic):
    """A broker subscription to the session's live events, fed in seq order."""
    subscription = broker.subscribe(topic)
    if session_log.feed is None:
        session_log.feed = LiveFeed(session_log, topic)
        session_log.feed.start()
    return subscription
