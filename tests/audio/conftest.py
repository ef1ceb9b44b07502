"""Fixtures of the audio service's tests: the service under gunicorn with a seeded
local sound library, and a counting wrapper around espeak-ng to watch probes."""

import pytest

from tests.support.audio import start_audio


@pytest.fixture(scope="module")
def audio(start_module_service, tmp_path_factory):
    """One audio service per module: espeak-ng speech, the seeded local library."""
    return start_audio(start_module_service, tmp_path_factory.mktemp("audio"))


@pytest.fixture
def fresh_audio(start_service, tmp_path):
    """start(env) -> Audio: a service of the test's own, with short probe intervals."""

    def start(env=None):
        data_dir = tmp_path / "audio-data"
        data_dir.mkdir(exist_ok=True)
        return start_audio(start_service, data_dir, {"AUDIO_PROBE_INTERVAL": "1", **(env or {})})

    return start
