"""The anonymous view of a collection, published as a file that nginx sends by itself.

After every event of its collection each open page reads its list again, and every
anonymous visitor (`public`) sees the same list. Where nginx serves the lists folder (the
site sends `X-Wiz-Accel-Lists`), the first anonymous read of a whole collection that
reaches the service publishes that view as `<lists>/public/<name>.json`. From then on
nginx answers anonymous `GET /api/collections/<name>` without a query from that file,
without asking the service (nginx/sites/wizard.conf.j2); every other read still reaches
the service.

A published view is never behind an announced event: before a process announces a
write (events.on_announce) it rebuilds the views that are published or being published
(a first read marks its view before it reads the counter), so a page that reads again
after the event finds the new list. Builds may finish in any order: each view's state
keeps the highest counter stored, and no build of an older counter is stored after it,
even when the file was withdrawn meanwhile. A rebuild that fails withdraws the file
(nginx then asks the service). Each start of a worker withdraws every file, so nothing
written while the service was stopped (a migration, a restored database) is served
stale; the next anonymous read publishes again.

nginx tags a file by its modification time (whole seconds) and size. Each new content is
given a later whole second than the one before it, so two contents never share an ETag,
and an unchanged content keeps its file (and its ETag: a page's If-None-Match gets 304).

One host only: the rebuild runs in the writing process, which reaches this host's folder
alone. So publishing is on with SQLite (one host by nature) and off with PostgreSQL,
where another host's page could read its own host's file before that host heard of the
write.
"""

import contextlib
import fcntl
import json
import logging
import os
import time

import gevent
from peewee import SqliteDatabase

from app.common.db import connection_for_block
from app.common.fsutil import read_json
from app.wizard import cache, collections, events, list_files
from app.wizard.identity import PUBLIC, Identity
from app.wizard.models import database

log = logging.getLogger("bundle.wizard")
VISITOR = Identity(PUBLIC, frozenset())
LOCK_WAIT_SECONDS = 0.002  # between two tries of the folder's lock (held for a file's write)

_folder = None  # set by enable(): where this process publishes; None: it does not
# A view's state (`<name>.state`): the counter no older build may be stored below, the
# tag of the published bytes, and the whole-second mtime of the last file written.
NEVER_STORED = {"version": 0, "tag": None, "mtime": 0}


def enable(lists_dir):
    """Publish into `<lists_dir>/public` from now on (or nothing when the database may
    be shared by several hosts), after withdrawing every view an earlier run left
    there."""
    global _folder
    _folder = None
    folder = os.path.join(lists_dir, "public")
    if not isinstance(database.obj, SqliteDatabase):
        # Left from before a move to PostgreSQL: nothing here would keep them current.
        _remove_bodies(folder)
        return
    os.makedirs(folder, exist_ok=True)
    _folder = folder
    with _locked():
        _remove_bodies(folder)
        _forget_versions_past_the_database()


def offer(name):
    """An anonymous read of all of `name` reached the service: publish the view if it
    is not published yet."""
    if _folder is None or os.path.exists(_body_path(name)):
        return
    with _locked():
        if _read_state(name) is None:  # from now on every write of `name` rebuilds it
            _write_state(name, NEVER_STORED)
    _publish(name)


def refresh(versions):
    """Before `versions` ({collection: counter}) are announced: rebuild their views
    that are published or being published."""
    if _folder is None:
        return
    for name in versions:
        if os.path.exists(_state_path(name)):
            _publish(name)


def _publish(name):
    try:
        with connection_for_block(database):
            version = cache.version(name)  # the view built next is at least this new
            view = collections.list_rows(name, VISITOR, {})
        store(name, version, view)
    except Exception:
        log.exception("the anonymous view of %s could not be published; nginx asks the service for it", name)
        withdraw(name)


def store(name, version, view):
    """Write `view` (a cache.Answer, at least as new as the counter `version`) as the
    published file of `name`, under the folder's lock. A state's version only rises:
    once a view of counter v was stored (even if its file was withdrawn since), no
    build of an older counter is, so a view never moves back past an announced write."""
    with _locked():
        state = _read_state(name) or NEVER_STORED
        if version < state["version"]:
            return
        if state["tag"] == view.tag and _body_is(name, state):
            if version > state["version"]:
                _write_state(name, {**state, "version": version})  # same bytes: the file and its ETag stay
            return
        mtime = max(int(time.time()), state["mtime"] + 1)
        # The state first: a body cut short by a crash does not match it, and is replaced.
        _write_state(name, {"version": version, "tag": view.tag, "mtime": mtime})
        list_files.write_whole(_body_path(name), view.body, mtime)


def withdraw(name):
    try:
        with _locked():
            os.unlink(_body_path(name))
    except FileNotFoundError:
        pass
    except OSError:
        # The write has committed: its answer must not fail. nginx may send this view
        # stale until the file can be replaced or removed.
        log.exception("the anonymous view of %s could not be withdrawn", name)


def _remove_bodies(folder):
    if not os.path.isdir(folder):
        return
    for entry in os.scandir(folder):
        if entry.name.endswith((".json", ".tmp")):  # (a .tmp: a write cut short)
            # Without the lock (on PostgreSQL) another starting worker may remove it first.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def _forget_versions_past_the_database():
    """A database replaced by an older one (a restore) has counters below the states':
    start those views again (keeping their last mtime, so tags stay unique)."""
    with connection_for_block(database):
        for entry in os.scandir(_folder):
            if entry.name.endswith(".state"):
                name = entry.name[: -len(".state")]
                state = _read_state(name)
                if state is None:  # unreadable: started again
                    _write_state(name, NEVER_STORED)
                elif cache.version(name) < state["version"]:
                    _write_state(name, {**NEVER_STORED, "mtime": state["mtime"]})


def _body_is(name, state):
    """Whether the published file is the one `state` describes (its mtime is unique)."""
    try:
        return int(os.stat(_body_path(name)).st_mtime) == state["mtime"]
    except FileNotFoundError:
        return False


def _body_path(name):
    return os.path.join(_folder, name + ".json")


def _state_path(name):
    return os.path.join(_folder, name + ".state")


def _read_state(name):
    """The state of `name`'s view, or None (never published, or unreadable: a state
    is replaced whole, so only a damaged disk makes one unreadable)."""
    try:
        return read_json(_state_path(name))
    except ValueError:
        log.warning("the state of the anonymous view of %s is unreadable; it starts again", name)
        return None


def _write_state(name, state):
    list_files.write_whole(_state_path(name), json.dumps(state).encode())


class _locked:
    """The folder's lock, shared by every process of the host. Taken without blocking
    the worker's other greenlets: it is only held while a file is written."""

    def __enter__(self):
        self.handle = open(os.path.join(_folder, ".lock"), "a")
        try:
            while True:
                try:
                    fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return self
                except BlockingIOError:
                    gevent.sleep(LOCK_WAIT_SECONDS)
        except BaseException:  # a timeout while waiting
            self.handle.close()
            raise

    def __exit__(self, *exc):
        self.handle.close()  # releases the lock


events.on_announce(refresh)
