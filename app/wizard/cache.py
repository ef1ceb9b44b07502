"""Answers to collection reads, kept while their collection has not changed.

Every write raises its collection's counter in `collection_versions` inside the
write's transaction, so one indexed read tells any worker process whether a cached
answer is still current; a list of a thousand rows is then not rebuilt for every
reader of an unchanged collection. Each answer carries a tag of its content (its
ETag), so a reader whose view did not change can be told so in a few bytes.
"""

import hashlib
from collections import OrderedDict, namedtuple

from app.common.db import run_sql
from app.wizard.models import CollectionVersion, database

MAX_ENTRIES = 256
MAX_BODY = 4 * 1024 * 1024  # larger answers are rebuilt each time rather than kept
_entries: OrderedDict[object, tuple] = OrderedDict()  # key -> (version, Answer); least recently used first

Answer = namedtuple("Answer", "body tag")


def answer(body):
    """`body` with its content tag: 24 hex digits of its BLAKE2b digest (the same bytes
    give the same tag in every worker and on every host)."""
    return Answer(body, hashlib.blake2b(body, digest_size=12).hexdigest())


# Prebuilt: building the query with peewee on every read costs more than running it.
_VERSION_SQL = "SELECT version FROM collection_versions WHERE name = ?"


def version(name):
    row = run_sql(database, _VERSION_SQL, (name,)).fetchone()
    return row[0] if row else 0


def bump(*names):
    """Raise the counters of `names`, inside the write's transaction; returns
    {name: new counter} for events.announce after the commit."""
    for name in names:
        CollectionVersion.update(version=CollectionVersion.version + 1).where(CollectionVersion.name == name).execute()
    return {name: version(name) for name in names}


def clear():
    """Forget every answer: for a process that opens another database, whose counters
    count other writes (the tests' in-process apps open one after another)."""
    _entries.clear()


def get(key, current_version):
    entry = _entries.get(key)
    if entry is None or entry[0] != current_version:
        return None
    _entries.move_to_end(key)
    return entry[1]


def put(key, current_version, kept):
    """Keep the Answer `kept` for `key` while the collection is at `current_version`."""
    if len(kept.body) > MAX_BODY:
        return
    _entries[key] = (current_version, kept)
    _entries.move_to_end(key)
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
