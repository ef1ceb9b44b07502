"""Hearing at once of what other processes do to a file, through Linux's inotify.

One inotify instance per worker process (one file descriptor), read by one greenlet
that hands each event to the watches of its watch descriptor; a watch's callback
only flags the change (it must not block), and its owner reads the file.

A file is watched through its directory, for its name, so that the watch survives
the file being replaced: a restore that renames a copy over it, or deletes and
writes it again, changes the inode behind the name, and the directory still
reports the name's events. The directory's parent is watched for the directory's
name too, so that a directory deleted and made again (or renamed away and back)
is watched again by path.

What wakes a watch, for its name: CLOSE_WRITE (a writer closed the file: the
event log's writers close it after their fdatasync, so what they appended is
durable by then, and a whole batch wakes a reader once), CREATE, DELETE,
MOVED_FROM, MOVED_TO (the name now stands for another file, or none); for the
directory itself, DELETE_SELF and MOVE_SELF (it is then watched again by path).
A queue overflow wakes every watch. A writer that kept the file open and never
closed it would go unheard: every writer of the log opens, appends and closes.
"""

import errno
import logging
import os

import gevent
from gevent.socket import wait_read

try:
    from inotify_simple import INotify, flags
except (ImportError, OSError):  # not Linux, or no C library to call
    INotify = flags = None

log = logging.getLogger("bundle.decks.logwatch")

if flags is not None:
    _NAME_EVENTS = flags.CLOSE_WRITE | flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO
    _SELF_GONE = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED | flags.UNMOUNT
    _MASK = _NAME_EVENTS | flags.DELETE_SELF | flags.MOVE_SELF | flags.ONLYDIR | flags.EXCL_UNLINK


class Unavailable(Exception):
    """Changes of this file cannot be watched here; the message says why."""


class Watch:
    """One callback for the changes of one file path; `cancel()` ends it."""

    def __init__(self, watcher, path, callback):
        directory, name = os.path.split(os.path.abspath(path))
        parent, directory_name = os.path.split(directory)
        self._watcher = watcher
        self.path = path
        self.callback = callback
        # (directory, entry name) pairs: the file in its directory, the directory in its parent.
        self.entries = ((parent, directory_name), (directory, name))
        self.active = True

    def cancel(self):
        if self.active:
            self.active = False
            self._watcher._remove(self)


class _Directory:
    """A watched directory: its watch descriptor (None while the path has no
    directory) and, by entry name, the watches that want to hear of it."""

    __slots__ = ("path", "wd", "names")

    def __init__(self, path):
        self.path, self.wd, self.names = path, None, {}

    def watches(self):
        return {watch for watches in self.names.values() for watch in watches}


class LogWatcher:
    """The inotify instance of a process and its reader greenlet. Use it from the
    greenlets of one gevent loop (a worker's)."""

    def __init__(self):
        self._inotify = None
        self._directories = {}  # path -> _Directory
        self._by_wd = {}  # wd -> {_Directory} (one unless two paths name one directory)
        self._reader = None
        self.error = None
        if INotify is None:
            self.error = "inotify is not available on this system"
            return
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as exc:
            self.error = (
                f"inotify_init1: {exc.strerror} (the limit of inotify instances, "
                "fs.inotify.max_user_instances, or of open files)"
            )

    @property
    def available(self):
        return self._inotify is not None

    def watch(self, path, callback):
        """Call `callback()` (on this loop, from the reader greenlet; it must not block)
        whenever the file at `path` may have changed: written and closed, created,
        replaced or deleted, or its directory replaced. Returns a Watch; raises
        Unavailable when inotify cannot watch it (no instance, the limit of watches)."""
        if self._inotify is None:
            raise Unavailable(self.error)
        watch = Watch(self, path, callback)
        try:
            for directory, name in watch.entries:
                self._add(directory, name, watch)
        except OSError as exc:
            watch.cancel()
            raise Unavailable(
                f"inotify_add_watch: {exc.strerror} (fs.inotify.max_user_watches?)"
                if exc.errno == errno.ENOSPC
                else f"inotify_add_watch: {exc.strerror}"
            ) from exc
        if self._reader is None:
            self._reader = gevent.spawn(self._read_events)
        return watch

    def close(self):
        """End every watch and close the instance (a worker keeps its own for its life)."""
        if self._reader is not None:
            self._reader.kill()
            self._reader = None
        self._directories.clear()
        self._by_wd.clear()
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    def watched_directories(self):
        """The paths of the directories watched now (for tests and diagnostics)."""
        return {path for path, entry in self._directories.items() if entry.wd is not None}

    # ------------------------------------------------------------------ registry

    def _add(self, path, name, watch):
        entry = self._directories.get(path)
        if entry is None:
            entry = self._directories[path] = _Directory(path)
            try:
                self._attach(entry)
            except FileNotFoundError:
                if watch.entries[0][0] == path:
                    del self._directories[path]
                    raise  # the parent must exist; the file's directory may come later
            except OSError:
                del self._directories[path]
                raise
        entry.names.setdefault(name, set()).add(watch)

    def _remove(self, watch):
        for path, name in watch.entries:
            entry = self._directories.get(path)
            if entry is None:
                continue
            watches = entry.names.get(name)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del entry.names[name]
            if not entry.names:
                del self._directories[path]
                self._detach(entry)
        if not self._directories and self._reader is not None and self._reader is not gevent.getcurrent():
            self._reader.kill(block=False)
            self._reader = None

    def _attach(self, entry):
        """Watch the directory now at `entry.path` (FileNotFoundError if none)."""
        wd = self._inotify.add_watch(entry.path, _MASK)
        if entry.wd != wd:
            self._detach(entry)
            entry.wd = wd
            self._by_wd.setdefault(wd, set()).add(entry)

    def _detach(self, entry, gone=False):
        """Stop watching `entry`'s directory (`gone`: the kernel dropped the watch)."""
        wd, entry.wd = entry.wd, None
        sharing = self._by_wd.get(wd)
        if sharing is None:
            return
        sharing.discard(entry)
        if sharing:
            return
        del self._by_wd[wd]
        if not gone:
            try:
                self._inotify.rm_watch(wd)
            except OSError:
                pass  # already dropped by the kernel (its IN_IGNORED is on the way)

    def _reattach(self, entry):
        """The directory at `entry.path` may be another one now: watch that (or none
        until it is made again), and wake every watch of it."""
        try:
            self._attach(entry)
        except FileNotFoundError:
            self._detach(entry)
        except OSError as exc:
            self._detach(entry)
            log.warning("cannot watch %s again: %s", entry.path, exc.strerror)
        for watch in entry.watches():
            watch.callback()

    # ------------------------------------------------------------------ reader

    def _read_events(self):
        fd = self._inotify.fileno()
        while self._directories:
            wait_read(fd)
            for event in self._inotify.read(timeout=0):
                self._dispatch(event)
        if self._reader is gevent.getcurrent():
            self._reader = None

    def _dispatch(self, event):
        if event.mask & flags.Q_OVERFLOW:
            log.warning("inotify queue overflow: every watched log is read again")
            for entry in list(self._directories.values()):
                for watch in entry.watches():
                    watch.callback()
            return
        for entry in list(self._by_wd.get(event.wd, ())):
            if event.mask & _SELF_GONE:
                self._detach(entry, gone=not event.mask & flags.MOVE_SELF)
                self._reattach(entry)
                continue
            if not event.mask & _NAME_EVENTS:
                continue
            for watch in list(entry.names.get(event.name, ())):
                watch.callback()
            child = self._directories.get(os.path.join(entry.path, event.name))
            if child is not None and event.mask & (flags.CREATE | flags.MOVED_TO):
                self._reattach(child)


_process = {"pid": None, "watcher": None}


def process_watcher():
    """This process's LogWatcher. One whose inotify instance could not be made is
    replaced by a new attempt at the next call (a feed starting), so a process
    recovers once instances are free again."""
    watcher = _process["watcher"]
    if watcher is None or _process["pid"] != os.getpid() or not watcher.available:
        watcher = LogWatcher()
        _process.update(pid=os.getpid(), watcher=watcher)
    return watcher
