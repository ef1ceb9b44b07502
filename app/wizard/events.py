"""Collection events: `data: {"collection": name}` to every open /api/events stream.

A write publishes its collections on the broker at once, after its commit.

With REDIS_URL the broker is shared: that publish reaches the streams of every
worker, and nothing more is needed. Without it (the embedded default), writes made by
any other process sharing the database are noticed through the per-collection
counters that every write raises (`collection_versions`): while this process has
open streams, one greenlet reads the counters four times a second and announces the
collections whose counter moved past what this process last announced. (With Redis
that watcher would announce each write once more from every worker.)
"""

import logging

import gevent

from app.common.broker import broker
from app.wizard.models import CollectionVersion, database

TOPIC = "wizard:collections"
POLL_SECONDS = 0.25
log = logging.getLogger("bundle.wizard")
_announced: dict[str, int] = {}  # collection -> the last counter value announced by this process
_watcher = None
_before_announcing: list = []  # callables({collection: counter}) run before an announcement goes out


def forget():
    """For a process that opens another database: its counters count other writes."""
    _announced.clear()


def on_announce(callback):
    """Call `callback(versions)` before each announcement goes out, in the announcing
    process (public_lists brings its published views up to the write first)."""
    if callback not in _before_announcing:
        _before_announcing.append(callback)


def announce(versions):
    """After a write's commit: {collection: its counter after the write}."""
    for callback in _before_announcing:
        callback(versions)
    for name, version in versions.items():
        _announced[name] = max(version, _announced.get(name, 0))
        broker.publish(TOPIC, {"collection": name})


def subscribe():
    subscription = broker.subscribe(TOPIC)
    if not broker.shared:
        _ensure_watcher()
    return subscription


def _ensure_watcher():
    global _watcher
    if _watcher is None or _watcher.dead:
        _watcher = gevent.spawn(_watch)


def _counters():
    with database.connection_context():
        return dict(CollectionVersion.select(CollectionVersion.name, CollectionVersion.version).tuples())


def _watch():
    try:
        for name, version in _counters().items():  # the starting point: nothing to announce
            _announced.setdefault(name, version)
        while broker.subscriber_count(TOPIC):
            gevent.sleep(POLL_SECONDS)
            moved = {name: version for name, version in _counters().items() if version > _announced.get(name, 0)}
            if moved:
                announce(moved)
    except Exception:
        # The next subscription starts a new watcher; streams stay open meanwhile.
        log.exception("the collection watcher stopped")
