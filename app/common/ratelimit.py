"""A sliding-window rate limiter, in this process (each worker counts on its own;
a shared backend would go behind the same interface)."""
import math
import time
from collections import defaultdict, deque


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
