"""What every speech provider and sound library offers, and how they fail.

A provider that cannot serve raises `Unavailable` (503: its configuration is
missing or it is unreachable) or `ProviderFailed` (502: it answered wrongly, too
slowly or too much). Routes never fake a result.
"""

from abc import ABC, abstractmethod

import gevent.lock

PREVIEW_ROUTE = "/api/audio/soundlib/preview/"


class Unavailable(Exception):
    """503: the provider cannot serve; `reason` says why, without secrets."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Busy(Unavailable):
    """503 with Retry-After: every engine slot is taken and the queue is full."""


class ProviderFailed(Exception):
    """502: the provider was asked and failed."""


class TooLarge(ProviderFailed):
    """The provider's answer grew past AUDIO_MAX_RESPONSE_BYTES."""


def read_capped(chunks, limit, what):
    """Join byte chunks, failing with TooLarge as soon as they pass `limit`."""
    parts, total = [], 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"{what} is larger than the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


class SpeechProvider(ABC):
    """A speech engine. A voice is {id, name, locale, gender}. Subclasses say how
    to probe, list voices and speak; the checks and limits around them are here."""

    name = "speech"

    def __init__(self, settings):
        self.settings = settings
        self._voices = None
        # Engine processes at once in this worker; up to `synthesis_queue` more wait for
        # a slot, and any further one is told at once that it is busy (never a pile-up).
        self._slots = gevent.lock.BoundedSemaphore(settings.max_concurrent_synthesis)
        self._waiting = 0

    @abstractmethod
    def probe(self):
        """Return if the engine can synthesize now; raise Unavailable otherwise."""

    @abstractmethod
    def _load_voices(self, timeout):
        """Every voice of the engine."""

    @abstractmethod
    def _speak(self, text, voice_id, rate, pitch, volume):
        """MP3 bytes of `text` in a known voice."""

    def voices(self, locale=None):
        """The voices, those of `locale` only when given (see matches_locale)."""
        if self._voices is None:
            self._voices = self._load_voices(self.settings.provider_timeout)
        return [v for v in self._voices if matches_locale(v["locale"], locale)]

    def synthesize(self, text, voice_id, rate, pitch, volume):
        """MP3 bytes of `text`; rate 0.5–2, pitch 0–2, volume 0–1 (1, 1, 1 = normal)."""
        if not any(v["id"] == voice_id for v in self.voices()):
            raise LookupError(f"unknown voice {voice_id!r}")
        if self._slots.locked() and self._waiting >= self.settings.synthesis_queue:
            raise Busy("the speech engine is busy; try again shortly")
        self._waiting += 1
        try:
            acquired = self._slots.acquire(timeout=self.settings.provider_timeout)
        finally:
            self._waiting -= 1
        if not acquired:
            raise Busy("the speech engine is busy; try again shortly")
        try:
            audio = self._speak(text, voice_id, rate, pitch, volume)
        finally:
            self._slots.release()
        return read_capped([audio], self.settings.max_response_bytes, "the synthesized speech")


class SoundLibrary(ABC):
    """A sound library. Ids carry the library's name, e.g. "local:rain.mp3", "freesound:1234".
    A result is {id, name, tags, duration, license, preview_url}, where preview_url
    is this service's own preview route for that id."""

    name = "soundlib"

    @abstractmethod
    def probe(self):
        """Return if the library can answer now; raise Unavailable otherwise."""

    @abstractmethod
    def search(self, query, results):
        """At most `results` results for the words of `query`."""

    @abstractmethod
    def preview(self, key):
        """(content type, audio bytes, identity) of the sound with id `<name>:<key>`;
        the identity names the provider and sound that answered, for the
        X-Preview-Identity header. LookupError when there is no such sound."""


def matches_locale(voice_locale, wanted):
    """`en` matches en-US and en-GB; `en-us` matches en-US; case and _/- ignored."""
    if not wanted:
        return True
    have = voice_locale.lower().replace("_", "-")
    want = wanted.lower().replace("_", "-")
    return have == want or have.startswith(want + "-")
