"""The providers chosen by configuration, each with its readiness probe, and the
probes' states as /metrics shows them."""

from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

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


class ProbeStates:
    """A prometheus_client collector (app.common.metrics.on_scrape) of the providers'
    probes: `bundle_audio_provider_up{role, provider}` is 1 while the provider's latest
    probe found it usable, 0 otherwise. It never waits for a probe: a result past its
    interval is shown while the refresh it starts runs (so it may be one interval behind),
    and a provider not yet probed has no series."""

    def __init__(self):
        self.providers = None  # the app's Providers (the latest app's, in a test process)

    def collect(self):
        providers = self.providers
        if providers is None:
            return
        up = GaugeMetricFamily(
            "bundle_audio_provider_up",
            "1 while the provider's latest readiness probe found it usable, else 0; role: speech or soundlib",
            labels=["role", "provider"],
        )
        for role, provider, probe in (
            ("speech", providers.speech, providers.speech_probe),
            ("soundlib", providers.soundlib, providers.soundlib_probe),
        ):
            result = probe.latest()
            if result is not None:
                up.add_metric([role, provider.name], 1 if result.available else 0)
        yield up


probe_states = ProbeStates()
