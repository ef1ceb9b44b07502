"""The audio service's own metrics on `/metrics`: each provider's probe state."""

from devtools.waiting import wait_for
from tests.support.metrics import scrape

UP = "bundle_audio_provider_up"


def test_provider_up_follows_its_probe(fresh_audio):
    audio = fresh_audio({"AUDIO_PROBE_INTERVAL": "0.5", "AUDIO_PROBE_TIMEOUT": "10"})

    def speech_up(expected):
        def check():
            metrics = scrape(audio.service)
            return metrics.value(UP, role="speech", provider="espeak-ng") == expected and metrics

        return check

    metrics = wait_for(speech_up(1), "espeak-ng up", timeout=10)
    assert metrics.value(UP, role="soundlib", provider="local") == 1
    assert {tuple(sorted(labels.items())) for labels in metrics.labels_of(UP)} == {
        (("provider", "espeak-ng"), ("role", "speech")),
        (("provider", "local"), ("role", "soundlib")),
    }

    # A scrape never waits for a probe: the one it starts shows at a later scrape.
    audio.down_flag.write_text("down")
    metrics = wait_for(speech_up(0), "espeak-ng down", timeout=10)
    assert metrics.value(UP, role="soundlib", provider="local") == 1
    audio.down_flag.unlink()
    wait_for(speech_up(1), "espeak-ng up again", timeout=10)
