"""Readiness probes of the providers: each provider probed on its own, with its
own deadline; the result reused for `interval` seconds, then refreshed by one probe
(a single flight). So a flood of /ready calls costs a provider at most one probe per
interval. The first probes start with the worker.

Past its interval an "available" answer is still given at once while the probe
runs (stale while revalidating: no caller waits behind a probe of a provider that
worked). An "unavailable" answer is never given past its interval: the callers
wait for the fresh one (at most the deadline), so a provider that an admin just
fixed (a sound folder created, an engine installed) is seen at the next probe.
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
        """The latest result while it is fresh; past its interval, a refresh starts and
        an available result is answered at once, an unavailable one only after the
        refresh (see the module's docstring)."""
        result = self._result
        if result is not None and self.expires_in(result) > 0:
            return result
        self.refresh()
        if result is not None and result.available:
            return result
        return self._inflight.get()

    def expires_in(self, result):
        """Seconds until `result` is past its interval (0 or less once it is)."""
        return self.interval - (self._clock() - result.checked_at)

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
