"""A sliding-window rate limiter: `hit(key)` counts one attempt and answers None when
it is allowed, else the seconds to wait.

`RateLimiter` counts in this process (each worker on its own); `SharedRateLimiter`
counts in Redis for every process of the deployment. `limiter(name, limit, window)`
gives the one that REDIS_URL asks for.
"""
import hashlib
import logging
import math
import secrets
import time
from collections import defaultdict, deque

import redis

from app.common import redis_client

log = logging.getLogger("bundle.ratelimit")


class RateLimiter:
    def __init__(self, limit, window_seconds, clock=time.monotonic, max_keys=100_000):
        self.limit, self.window, self._clock, self.max_keys = limit, window_seconds, clock, max_keys
        self._hits = defaultdict(deque)

    def hit(self, key):
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

    def _prune(self, now):
        for key in [k for k, h in self._hits.items() if not h or h[-1] <= now - self.window]:
            del self._hits[key]


# One sorted set per key, scored by the time of each allowed attempt (in ms, Redis's
# own clock, so that hosts whose clocks differ count alike). Atomic: a script runs
# alone in Redis, so two workers cannot both take the last place.
_HIT = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
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


class SharedRateLimiter:
    """The same sliding window, counted in Redis across every process. While Redis
    cannot be reached, attempts are counted in this process instead (logged): the
    limit then holds per worker, and sign-in keeps working."""

    def __init__(self, client, name, limit, window_seconds):
        self.limit, self.window = limit, window_seconds
        self._name = name
        self._script = client.register_script(_HIT)
        self._fallback = RateLimiter(limit, window_seconds)

    def hit(self, key):
        try:
            wait_ms = self._script(keys=[self._key(key)],
                                   args=[int(self.window * 1000), self.limit, secrets.token_hex(8)])
        except redis.RedisError as exc:
            log.warning("rate limit %s counted in this process only: Redis failed: %s", self._name,
                        redis_client.describe(exc))
            return self._fallback.hit(key)
        return None if wait_ms < 0 else max(1, math.ceil(wait_ms / 1000))

    def _key(self, key):
        # Hashed: a key may be an account's e-mail address, and may be long.
        digest = hashlib.sha256(str(key).encode("utf-8")).hexdigest()[:32]
        return redis_client.key("ratelimit", self._name, digest)


def limiter(name, limit, window_seconds):
    """A limiter of `limit` attempts a `window_seconds` per key: shared through Redis when
    REDIS_URL is set, in this process otherwise. `name` (e.g. "workspace:login:address")
    keeps the counts of different limits apart."""
    client = redis_client.client()
    if client is None:
        return RateLimiter(limit, window_seconds)
    return SharedRateLimiter(client, name, limit, window_seconds)
