"""Abuse limits of speech, the costly route (each request runs an engine process).

Per client address (app.common.clientaddr: nginx's X-Real-IP): at most
AUDIO_SPEECH_PER_MINUTE requests a minute (a sliding window, counted in Redis across
every worker when REDIS_URL is set), and at most AUDIO_SPEECH_CONCURRENT_PER_ADDRESS
syntheses at once in a worker (below AUDIO_MAX_CONCURRENT_SYNTHESIS, so that one
address never holds every engine slot). Both answer 429 with Retry-After.
The engine slots and their bounded queue are the provider's (app.audio.providers).
"""

from collections import Counter
from contextlib import contextmanager

from app.common import ratelimit
from app.common.clientaddr import client_address
from app.common.failures import TooManyRequests


class SpeechLimits:
    def __init__(self, per_minute: int, at_once: int):
        self.per_minute, self.at_once = per_minute, at_once
        self._rate = ratelimit.limiter("audio:speech:address", per_minute, 60)
        self._running: Counter[str] = Counter()  # address -> syntheses under way in this worker

    @contextmanager
    def admit(self):
        """Count one speech request of this request's address; 429 when over a limit."""
        address = client_address()
        wait = self._rate.hit(address)
        if wait is not None:
            raise TooManyRequests(
                f"too many speech requests: at most {self.per_minute} a minute from one address", retry_after=wait
            )
        if self._running[address] >= self.at_once:
            raise TooManyRequests(
                f"too many speech requests at once: at most {self.at_once} from one address", retry_after=1
            )
        self._running[address] += 1
        try:
            yield
        finally:
            self._running[address] -= 1
            if not self._running[address]:
                del self._running[address]
