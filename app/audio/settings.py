"""The audio service's configuration, read once from the environment at start."""
import os
from dataclasses import dataclass

from app.common.config import env_choice, env_int, env_seconds, env_str


@dataclass(frozen=True)
class AudioSettings:
    public_origin: str           # AUDIO_PUBLIC_ORIGIN: the only Origin accepted when one is sent
    tts_provider: str            # AUDIO_TTS_PROVIDER: espeak (default) or edge
    espeak_binary: str           # AUDIO_ESPEAK_BINARY
    soundlib_provider: str       # AUDIO_SOUNDLIB_PROVIDER: local (default) or freesound
    soundlib_dir: str            # SOUNDLIB_DIR, default DATA_DIR/soundlib
    freesound_api_key: str       # FREESOUND_API_KEY (a secret: never logged nor answered)
    freesound_api_url: str       # FREESOUND_API_URL, default https://freesound.org/apiv2
    max_response_bytes: int      # AUDIO_MAX_RESPONSE_BYTES, default 16 MiB
    probe_interval: float        # AUDIO_PROBE_INTERVAL: probe results are reused this long
    probe_timeout: float         # AUDIO_PROBE_TIMEOUT: a probe's deadline
    provider_timeout: float      # AUDIO_PROVIDER_TIMEOUT: a synthesis, search or preview's deadline
    max_concurrent_synthesis: int  # AUDIO_MAX_CONCURRENT_SYNTHESIS: engine processes at once per worker
    synthesis_queue: int = 8     # AUDIO_SYNTHESIS_QUEUE: syntheses that may wait for an engine per worker
    speech_per_minute: int = 30  # AUDIO_SPEECH_PER_MINUTE: speech requests a client address may make a minute
    speech_per_address: int = 2  # AUDIO_SPEECH_CONCURRENT_PER_ADDRESS: its syntheses at once per worker

    @classmethod
    def from_env(cls, data_dir):
        return cls(
            public_origin=env_str("AUDIO_PUBLIC_ORIGIN").rstrip("/"),
            tts_provider=env_choice("AUDIO_TTS_PROVIDER", "espeak", ("espeak", "edge")),
            espeak_binary=env_str("AUDIO_ESPEAK_BINARY", "espeak-ng"),
            soundlib_provider=env_choice("AUDIO_SOUNDLIB_PROVIDER", "local", ("local", "freesound")),
            soundlib_dir=os.path.abspath(env_str("SOUNDLIB_DIR", os.path.join(data_dir, "soundlib"))),
            freesound_api_key=env_str("FREESOUND_API_KEY"),
            freesound_api_url=env_str("FREESOUND_API_URL", "https://freesound.org/apiv2").rstrip("/"),
            max_response_bytes=env_int("AUDIO_MAX_RESPONSE_BYTES", 16 * 1024 * 1024, minimum=1024),
            probe_interval=env_seconds("AUDIO_PROBE_INTERVAL", 15.0),
            probe_timeout=env_seconds("AUDIO_PROBE_TIMEOUT", 3.0),
            provider_timeout=env_seconds("AUDIO_PROVIDER_TIMEOUT", 20.0),
            max_concurrent_synthesis=env_int("AUDIO_MAX_CONCURRENT_SYNTHESIS", 4, minimum=1, maximum=64),
            synthesis_queue=env_int("AUDIO_SYNTHESIS_QUEUE", 8, minimum=0, maximum=1000),
            speech_per_minute=env_int("AUDIO_SPEECH_PER_MINUTE", 30, minimum=1, maximum=1_000_000),
            speech_per_address=env_int("AUDIO_SPEECH_CONCURRENT_PER_ADDRESS", 2, minimum=1, maximum=1000),
        )
