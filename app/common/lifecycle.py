"""Graceful stop: when the worker is told to stop (SIGTERM), open streams end at
once instead of holding the worker until gunicorn's graceful time-out.

`install()` chains a handler in front of the one gunicorn set, so gunicorn's own
handling still runs. It is called by wsgi.py, the production entry point.
"""

import signal
from collections.abc import Callable
from types import FrameType

import gevent

_callbacks: list[Callable[[], object]] = []


def on_stop(callback: Callable[[], object]) -> None:
    _callbacks.append(callback)


def run_stop_callbacks() -> None:
    for callback in list(_callbacks):
        callback()


def install() -> None:
    previous = signal.getsignal(signal.SIGTERM)

    def handle_term(signum: int, frame: FrameType | None) -> None:
        # Like gunicorn's gevent worker: leave the signal handler at once, work in a greenlet.
        gevent.spawn(run_stop_callbacks)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handle_term)
