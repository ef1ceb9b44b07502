"""Blocking work (file I/O that may stall, fsync, CPU-heavy parsing) runs in gevent's
threadpool so that the worker's loop keeps serving other greenlets."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeVar

import gevent

if TYPE_CHECKING:
    from _thread import LockType

P = ParamSpec("P")
R = TypeVar("R")


class _App(Protocol):
    """What is used here of a Flask app (Flask itself is not imported: see _current_app)."""

    def app_context(self) -> AbstractContextManager[object]: ...


class _Raised:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def blocking(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run `fn` in the threadpool and return its result, or raise its exception here
    (caught in the thread, so the hub does not print it as a crash). The Flask app
    context, if any, goes along, so `current_app` works there too.

    `fn` must not use the database: the connection pool's lock and condition are
    gevent's in a patched worker, and a real thread waiting on them deadlocks with the
    greenlets (and SQLite's connections are bound to a thread). Read first, then hand
    the rows to `fn`."""
    app = _current_app()

    def call() -> R | _Raised:
        try:
            if app is None:
                return fn(*args, **kwargs)
            with app.app_context():
                return fn(*args, **kwargs)
        except Exception as exc:
            return _Raised(exc)

    result = gevent.get_hub().threadpool.apply(call)
    if isinstance(result, _Raised):
        raise result.exc
    return result


def native_lock() -> LockType:
    """A lock of the operating system's threads, even under gevent's monkey patch: it
    guards work done in the threadpool's real threads, where a gevent lock (tied to one
    hub) does not belong. Hold it briefly when a greenlet takes it: it blocks the loop."""
    from gevent import monkey

    if monkey.is_module_patched("threading"):
        lock: LockType = monkey.get_original("threading", "Lock")()
        return lock
    import threading

    return threading.Lock()


def _current_app() -> _App | None:
    """The Flask app of the running request or command, or None; Flask is not imported
    here, so a job worker that never loads it can use this module."""
    flask = sys.modules.get("flask")
    return flask.current_app._get_current_object() if flask is not None and flask.has_app_context() else None
