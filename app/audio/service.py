"""The providers chosen by configuration, each with its readiness probe."""

from dataclasses import dataclass

from app.audio.edge import EdgeSpeech
from app.audio.espeak import EspeakSpeech
from app.audio.freesound import FreesoundLibrary
from app.audio.local_library import LocalLibrary
from app.audio.probes import Probe, SharedProbe
from app.common import redis_client


@dataclass
class Providers:
    speech: object
    soundlib: object
    speech_probe: Probe
    soundlib_probe: Probe


def build_providers(settings):
    speech = EdgeSpeech(settings) if settings.tts_provider == "edge" else EspeakSpeech(settings)
    soundlib = FreesoundLibrary(settings) if settings.soundlib_provider == "freesound" else LocalLibrary(settings)
    providers = Providers(speech, soundlib, _probe("speech", speech, settings), _probe("soundlib", soundlib, settings))
    # The first probes run as the worker's loop starts, not on the first request.
    providers.speech_probe.refresh()
    providers.soundlib_probe.refresh()
    return providers


def _probe(role, provider, settings):
    """One probe per interval in this process, or for every process when REDIS_URL
    is set (a bad REDIS_URL fails the start here, naming it)."""
    client = redis_client.client()
    if client is None:
        return Probe(provider.probe, settings.probe_interval, settings.probe_timeout)
    return SharedProbe(
        provider.probe, settings.probe_interval, settings.probe_timeout, client, f"{role}:{provider.name}"
    )
