"""A sliding-window rate limiter: `hit(key)` counts one attempt and answers None when
it is allowed, else the seconds to wait.

`RateLimiter` is the interface; `LocalRateLimiter` counts in this process (each
worker on its own), `RedisRateLimiter` in Redis for every process of the deployment.
`limiter(name, limit, window)` gives the one that REDIS_URL asks for.

`Backoff` (`LocalBackoff` / `RedisBackoff`, made by `backoff(...)`) slows a key down
instead: a number of free attempts, then a delay that doubles with each further one
(sign-in failures).
"""

import hashlib
import logging
import math
import secrets
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable
from typing import Protocol

import redis

from app.common import redis_client

log = logging.getLogger("bundle.ratelimit")


class RateLimiter(Protocol):
    def hit(self, key: Hashable) -> int | None:
        """Count one attempt for `key`; None when allowed, else the seconds to wait."""
        ...


class LocalRateLimiter:
    """Counts in this process."""

    def __init__(
        self, limit: int, window_seconds: float, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000
    ) -> None:
        self.limit, self.window, self._clock, self.max_keys = limit, window_seconds, clock, max_keys
        self._hits: defaultdict[Hashable, deque[float]] = defaultdict(deque)

    def hit(self, key: Hashable) -> int | None:
        """Count one attempt for `key`; None when allowed, else the seconds to wait."""
        now = self._clock()
        hits = self._hits[key]
        while hits and hits[0] <= now - self.window:
            hits.popleft()
        if len(hits) >= self.limit:
            return max(1, math.ceil(hits[0] + self.window - now))
        hits.append(now)
        if len(self._hits) > self.max_keys:
            self._prune(now)
        return None

    def _prune(self, now: float) -> None:
        for key in [k for k, h in self._hits.items() if not h or h[-1] <= now - self.window]:
            del self._hits[key]


# The scripts' clock: Redis's own, in ms, so that every worker and host agrees.
_NOW_MS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""


def _redis_key(kind: str, name: str, key: Hashable) -> str:
    # Hashed: a key may be an account's e-mail address, and may be long.
    digest = hashlib.sha256(str(key).encode("utf-8")).hexdigest()[:32]
    return redis_client.key(kind, name, digest)


def _seconds(wait_ms: int) -> int | None:
    """A script's answer (-1: allowed, else the ms to wait) as limiters answer it."""
    return None if wait_ms < 0 else max(1, math.ceil(wait_ms / 1000))


# One sorted set per key, scored by the time of each allowed attempt (in ms, Redis's
# own clock, so that hosts whose clocks differ count alike). Atomic: a script runs
# alone in Redis, so two workers cannot both take the last place.
_HIT = (
    _NOW_MS
    + """
local window_ms, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - window_ms)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tonumber(oldest[2]) + window_ms - now_ms
end
redis.call('ZADD', KEYS[1], now_ms, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window_ms)
return -1
"""
)


class RedisRateLimiter:
    """The same sliding window, counted in Redis across every process. While Redis
    cannot be reached, attempts are counted in this process instead (logged): the
    limit then holds per worker, and sign-in keeps working."""

    def __init__(self, client: redis.Redis, name: str, limit: int, window_seconds: float) -> None:
        self.limit, self.window = limit, window_seconds
        self._name = name
        self._script = client.register_script(_HIT)
        self._fallback = LocalRateLimiter(limit, window_seconds)

    def hit(self, key: Hashable) -> int | None:
        try:
            wait_ms: int = self._script(
                keys=[self._key(key)], args=[int(self.window * 1000), self.limit, secrets.token_hex(8)]
            )
        except redis.RedisError as exc:
            log.warning(
                "rate limit %s counted in this process only: Redis failed: %s", self._name, redis_client.describe(exc)
            )
            return self._fallback.hit(key)
        return _seconds(wait_ms)

    def _key(self, key: Hashable) -> str:
        return _redis_key("ratelimit", self._name, key)


def limiter(name: str, limit: int, window_seconds: float) -> RateLimiter:
    """A limiter of `limit` attempts a `window_seconds` per key: shared through Redis when
    REDIS_URL is set, in this process otherwise. `name` (e.g. "workspace:login:address")
    keeps the counts of different limits apart."""
    client = redis_client.client()
    if client is None:
        return LocalRateLimiter(limit, window_seconds)
    return RedisRateLimiter(client, name, limit, window_seconds)


# --------------------------------------------------------------------------- back-off on failures


class Backoff(Protocol):
    """Slows a key down after a number of free attempts (LocalBackoff says how)."""

    def attempt(self, key: Hashable) -> int | None:
        """Count one attempt in advance; None when allowed, else the seconds to wait."""
        ...

    def forgive(self, key: Hashable) -> None:
        """Give one attempt back (it succeeded)."""
        ...

    def reset(self, key: Hashable) -> None:
        """Forget the key."""
        ...


class LocalBackoff:
    """Slows a key down after `free` attempts: each attempt past them makes the next
    wait `first_delay` seconds, doubled each time, at most `max_delay`. `attempt(key)`
    counts one attempt in advance (so that a burst of parallel ones cannot all pass
    before the first is judged) and answers None when allowed, else the seconds to
    wait; `forgive(key)` gives one back (the attempt succeeded), `reset(key)` forgets
    the key. A key with no attempt for `forget` seconds past its delay is forgotten.
    Counted in this process; `backoff()` gives the Redis one when REDIS_URL is set."""

    def __init__(
        self,
        free: int,
        first_delay: float,
        max_delay: float,
        forget: float,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        self.free, self.first, self.max, self.forget = free, first_delay, max_delay, forget
        self._clock, self.max_keys = clock, max_keys
        self._state: dict[Hashable, list[float]] = {}  # key -> [count, not_before, forgotten_at]

    def _delay(self, count: float) -> float:
        return min(self.first * 2 ** min(count - self.free, 40), self.max)

    def attempt(self, key: Hashable) -> int | None:
        now = self._clock()
        state = self._state.get(key)
        if state is None or state[2] <= now:
            state = self._state[key] = [0, 0.0, 0.0]
        if now < state[1]:
            return max(1, math.ceil(state[1] - now))
        state[0] += 1
        if state[0] >= self.free:
            state[1] = now + self._delay(state[0])
        state[2] = max(state[1], now) + self.forget
        if len(self._state) > self.max_keys:
            for stale in [k for k, s in self._state.items() if s[2] <= now]:
                del self._state[stale]
        return None

    def forgive(self, key: Hashable) -> None:
        state = self._state.get(key)
        if state is not None:
            state[0] = max(0, state[0] - 1)
            if state[0] < self.free:
                state[1] = 0.0

    def reset(self, key: Hashable) -> None:
        self._state.pop(key, None)


# KEYS[1]: a hash {count, not_before (ms, Redis's clock)}. ARGV: free, first delay ms,
# max delay ms, forget ms. Answers -1 when allowed, else the ms to wait.
_ATTEMPT = (
    _NOW_MS
    + """
local free, first, most, forget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'count', 'not_before')
local count, not_before = tonumber(state[1]) or 0, tonumber(state[2]) or 0
if now_ms < not_before then
  return not_before - now_ms
end
count = count + 1
if count >= free then
  not_before = now_ms + math.floor(math.min(first * 2 ^ math.min(count - free, 40), most))
end
redis.call('HSET', KEYS[1], 'count', count, 'not_before', not_before)
redis.call('PEXPIRE', KEYS[1], math.max(not_before - now_ms, 0) + forget)
return -1
"""
)
_FORGIVE = """
local count = tonumber(redis.call('HGET', KEYS[1], 'count')) or 0
if count <= 1 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('HSET', KEYS[1], 'count', count - 1)
if count - 1 < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'not_before', 0)
end
return count - 1
"""


class RedisBackoff:
    """LocalBackoff's rule counted in Redis across every process (in this process while
    Redis cannot be reached, logged, as RedisRateLimiter does)."""

    def __init__(
        self, client: redis.Redis, name: str, free: int, first_delay: float, max_delay: float, forget: float
    ) -> None:
        self._client, self._name = client, name
        self._args = [free, int(first_delay * 1000), int(max_delay * 1000), int(forget * 1000)]
        self._attempt, self._forgive = client.register_script(_ATTEMPT), client.register_script(_FORGIVE)
        self._fallback = LocalBackoff(free, first_delay, max_delay, forget)

    def _key(self, key: Hashable) -> str:
        return _redis_key("backoff", self._name, key)

    def _redis_failed(self, exc: redis.RedisError) -> None:
        log.warning(
            "back-off %s counted in this process only: Redis failed: %s", self._name, redis_client.describe(exc)
        )

    def attempt(self, key: Hashable) -> int | None:
        try:
            wait_ms: int = self._attempt(keys=[self._key(key)], args=self._args)
        except redis.RedisError as exc:
            self._redis_failed(exc)
            return self._fallback.attempt(key)
        return _seconds(wait_ms)

    def forgive(self, key: Hashable) -> None:
        try:
            self._forgive(keys=[self._key(key)], args=self._args[:1])
        except redis.RedisError as exc:
            self._redis_failed(exc)
            self._fallback.forgive(key)

    def reset(self, key: Hashable) -> None:
        try:
            self._client.delete(self._key(key))
        except redis.RedisError as exc:
            self._redis_failed(exc)
            self._fallback.reset(key)


def backoff(name: str, free: int, first_delay: float, max_delay: float, forget: float) -> Backoff:
    """A Backoff (see LocalBackoff): shared through Redis when REDIS_URL is set, in this
    process otherwise. `name` keeps the counts of different uses apart."""
    client = redis_client.client()
    if client is None:
        return LocalBackoff(free, first_delay, max_delay, forget)
    return RedisBackoff(client, name, free, first_delay, max_delay, forget)
