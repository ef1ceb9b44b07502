"""Readiness probes of the providers: each provider probed on its own, with its
own deadline; the result reused for `interval` seconds; an expired result is
refreshed by one probe in the background (a single flight) while callers get the
latest answer at once. So a flood of /ready calls costs a provider at most one
probe per interval, and only the callers before the first result ever wait, at
most the deadline. The first probes start with the worker.
"""
import time

import gevent
from gevent.event import AsyncResult

from app.audio.providers import Unavailable


class ProbeResult:
    def __init__(self, available, reason, checked_at):
        self.available, self.reason, self.checked_at = available, reason, checked_at


class Probe:
    def __init__(self, check, interval, timeout, clock=time.monotonic):
        self._check, self.interval, self.timeout, self._clock = check, interval, timeout, clock
        self._result = None
        self._inflight = None
        self._prober = None

    def state(self):
        """The latest result. Once expired it is still answered at once while one
        probe refreshes it in the background (stale while revalidating), so no
        caller waits behind a probe; only callers before the very first result wait,
        at most the deadline."""
        result = self._result
        if result is None or self._clock() - result.checked_at >= self.interval:
            self.refresh()
        return result if result is not None else self._inflight.get()

    def refresh(self):
        """Start a probe unless one is running."""
        if self._inflight is None:
            self._inflight = AsyncResult()
            self._prober = gevent.spawn(self._run, self._inflight)

    def _run(self, inflight):
        result = ProbeResult(False, "the probe ended without an answer", self._clock())
        try:
            # A plain gevent.Timeout is a BaseException: no `except Exception` in a
            # provider can swallow it.
            with gevent.Timeout(self.timeout):
                self._check()
            result = ProbeResult(True, None, self._clock())
        except gevent.Timeout:
            result = ProbeResult(False, f"the probe took more than {self.timeout:g} s", self._clock())
        except Unavailable as exc:
            result = ProbeResult(False, exc.reason, self._clock())
        except Exception as exc:  # a failed probe is an answer: the provider is not usable now
            result = ProbeResult(False, str(exc) or type(exc).__name__, self._clock())
        finally:
            # Whatever ended the probe, its waiters get an answer and the next call may probe again.
            self._result = result
            self._inflight = None
            inflight.set(result)
