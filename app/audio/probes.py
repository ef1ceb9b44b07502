"""Readiness probes of the providers: each provider probed on its own, with its
own deadline; the result reused for `interval` seconds, then refreshed by one probe
(a single flight). So a flood of /ready calls costs a provider at most one probe per
interval. The first probes start with the worker.

Past its interval an "available" answer is still given at once while the probe
runs (stale while revalidating: no caller waits behind a probe of a provider that
worked). An "unavailable" answer is never given past its interval: the callers
wait for the fresh one (at most the deadline), so a provider that an admin just
fixed (a sound folder created, an engine installed) is seen at the next probe.

With REDIS_URL, `SharedProbe` makes that one probe per interval for the whole
deployment: the result is kept in Redis with its time, and a short Redis lock
decides which process probes when it is stale; the others read its result.
"""

import json
import logging
import secrets
import time

import gevent
import redis
from gevent.event import AsyncResult

from app.audio.providers import Unavailable
from app.common import redis_client

log = logging.getLogger("bundle.audio")


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

    def latest(self):
        """The latest result without waiting (None before the first probe ended); past
        its interval a refresh starts, for the next caller."""
        result = self._result
        if result is None or self.expires_in(result) <= 0:
            self.refresh()
        return result

    def expires_in(self, result):
        """Seconds until `result` is past its interval (0 or less once it is)."""
        return self.interval - (self._clock() - result.checked_at)

    def refresh(self):
        """Start a refresh unless one is running."""
        if self._inflight is None:
            self._inflight = AsyncResult()
            self._prober = gevent.spawn(self._run, self._inflight)

    def _run(self, inflight):
        result = ProbeResult(False, "the probe ended without an answer", self._clock())
        try:
            result = self._fresh_result()
        finally:
            # Whatever ended the refresh, its waiters get an answer and the next call may refresh again.
            self._result = result
            self._inflight = None
            inflight.set(result)

    def _fresh_result(self):
        return self._probe()

    def _probe(self):
        """Run the check under its deadline; every outcome is a result."""
        try:
            # A plain gevent.Timeout is a BaseException: no `except Exception` in a
            # provider can swallow it.
            with gevent.Timeout(self.timeout):
                self._check()
            return ProbeResult(True, None, self._clock())
        except gevent.Timeout:
            return ProbeResult(False, f"the probe took more than {self.timeout:g} s", self._clock())
        except Unavailable as exc:
            return ProbeResult(False, exc.reason, self._clock())
        except Exception as exc:  # a failed probe is an answer: the provider is not usable now
            return ProbeResult(False, str(exc) or type(exc).__name__, self._clock())


# The lock outlives a probe (bounded by its deadline) by this much.
LOCK_MARGIN_SECONDS = 2.0
# How often a process that waits for another's probe looks for its result.
PEER_POLL_SECONDS = 0.1
# Deletes the lock only if it is still ours (it may have expired and been taken).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class SharedProbe(Probe):
    """A probe whose result every process of the deployment shares through Redis.
    Times are wall-clock seconds (the processes' monotonic clocks are not comparable
    across hosts). While Redis fails, this process probes for itself (logged)."""

    def __init__(self, check, interval, timeout, client, name, clock=time.time):
        super().__init__(check, interval, timeout, clock)
        self._client = client
        self._result_key = redis_client.key("audio", "probe", name)
        self._lock_key = self._result_key + ":lock"
        self._release = client.register_script(_RELEASE)

    def _fresh_result(self):
        try:
            return self._from_peers_or_probe()
        except redis.RedisError as exc:
            log.warning(
                "probe %s runs in this process only: Redis failed: %s", self._result_key, redis_client.describe(exc)
            )
            return self._probe()

    def _from_peers_or_probe(self):
        """A fresh stored result, else this process probes if it takes the lock, else
        it waits for the result of the process that holds it."""
        lock_seconds = self.timeout + LOCK_MARGIN_SECONDS
        give_up = self._clock() + 2 * lock_seconds  # a lock outlives its holder by at most lock_seconds
        while self._clock() < give_up:
            stored = self._fresh_stored()
            if stored is not None:
                return stored
            token = secrets.token_hex(8)
            if self._client.set(self._lock_key, token, nx=True, px=int(lock_seconds * 1000)):
                return self._probe_for_everyone(token)
            gevent.sleep(PEER_POLL_SECONDS)
        return self._probe()

    def _probe_for_everyone(self, token):
        try:
            # A peer may have stored a result between our read and our lock.
            stored = self._fresh_stored()
            if stored is not None:
                return stored
            result = self._probe()
            self._store(result)
            return result
        finally:
            self._quietly(self._release, keys=[self._lock_key], args=[token])

    def _fresh_stored(self):
        raw = self._client.get(self._result_key)
        if raw is None:
            return None
        try:
            fields = json.loads(raw)
            result = ProbeResult(bool(fields["available"]), fields["reason"], float(fields["checked_at"]))
        except (ValueError, KeyError, TypeError):
            return None  # not ours to read: probe anew and overwrite it
        return result if self.expires_in(result) > 0 else None

    def _store(self, result):
        value = json.dumps({"available": result.available, "reason": result.reason, "checked_at": result.checked_at})
        # Kept a while past its interval, then gone: a stale key would only be reread.
        self._quietly(self._client.set, self._result_key, value, px=int(max(2 * self.interval, 60) * 1000))

    def _quietly(self, call, *args, **kwargs):
        # After a probe, a Redis failure costs the others a probe of their own; this one has its answer.
        try:
            call(*args, **kwargs)
        except redis.RedisError as exc:
            log.warning("probe %s: Redis failed: %s", self._result_key, redis_client.describe(exc))
