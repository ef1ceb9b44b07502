"""What every speech provider and sound library offers, and how they fail.

A provider that cannot serve raises `Unavailable` (503: its configuration is
missing or it is unreachable) or `ProviderFailed` (502: it answered wrongly, too
slowly or too much). Routes never fake a result.
"""
from abc import ABC, abstractmethod

PREVIEW_ROUTE = "/api/audio/soundlib/preview/"


class Unavailable(Exception):
    """503: the provider cannot serve; `reason` says why, without secrets."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


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
    """A speech engine. A voice is {id, name, locale, gender}."""
    name = "speech"

    @abstractmethod
    def probe(self):
        """Return if the engine can synthesize now; raise Unavailable otherwise."""

    @abstractmethod
    def voices(self, locale=None):
        """The voices, those of `locale` only when given (see matches_locale)."""

    @abstractmethod
    def synthesize(self, text, voice_id, rate, pitch, volume):
        """MP3 bytes of `text`; rate 0.5–2, pitch 0–2, volume 0–1 (1, 1, 1 = normal)."""


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
