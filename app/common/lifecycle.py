"""Graceful stop: when the worker is told to stop (SIGTERM), open streams end at
once instead of holding the worker until gunicorn's graceful time-out, and the
process counts as stopping (`stopping()`: its `/readyz` answers 503 while it drains
the requests that still arrive on its kept-alive connections).

`install()` chains a handler in front of the one gunicorn set, so gunicorn's own
handling still runs. It is called by wsgi.py, the production entry point.
"""

import signal
from collections.abc import Callable
from types import FrameType

import gevent

_callbacks: list[Callable[[], object]] = []
_stopping = False


def on_stop(callback: Callable[[], object]) -> None:
    _callbacks.append(callback)


def run_stop_callbacks() -> None:
    for callback in list(_callbacks):
        callback()


def stopping() -> bool:
    """Whether this process received SIGTERM (through `install`'s handler)."""
    return _stopping


def install() -> None:
    previous = signal.getsignal(signal.SIGTERM)

    def handle_term(signum: int, frame: FrameType | None) -> None:
        global _stopping
        # First, before gunicorn's handler stops the worker's loop: any request
        # answered from now on sees the process stopping.
        _stopping = True
        # Like gunicorn's gevent worker: leave the signal handler at once, work in a greenlet.
        gevent.spawn(run_stop_callbacks)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handle_term)
