"""The audio service's configuration, read once from the environment at start.

Each variable is declared once below (name, default, bounds, meaning); the reference
in docs/services/audio.md is written from these declarations (devtools.reference)."""

import os
from dataclasses import dataclass

from app.common import config
from app.common.config import Choice, Integer, Seconds, Text

VARIABLES = config.Variables("audio", includes=(config.SHARED,))
PUBLIC_ORIGIN = VARIABLES.add(
    Text(
        name="AUDIO_PUBLIC_ORIGIN",
        values="origin (scheme://host[:port])",
        doc="The only Origin accepted when a request sends one; blank: every request that sends an Origin is refused.",
    )
)
TTS_PROVIDER = VARIABLES.add(
    Choice(name="AUDIO_TTS_PROVIDER", default="espeak", choices=("espeak", "edge"), doc="The speech engine.")
)
ESPEAK_BINARY = VARIABLES.add(
    Text(
        name="AUDIO_ESPEAK_BINARY",
        default="espeak-ng",
        values="command or path",
        doc="The espeak program the espeak engine runs.",
    )
)
SOUNDLIB_PROVIDER = VARIABLES.add(
    Choice(
        name="AUDIO_SOUNDLIB_PROVIDER",
        default="local",
        choices=("local", "freesound"),
        doc="Where the sound library's sounds come from: a local folder or Freesound.",
    )
)
SOUNDLIB_DIR = VARIABLES.add(
    Text(
        name="SOUNDLIB_DIR",
        shown_default="`$DATA_DIR/soundlib`",
        values="path",
        doc="The local sound library's folder.",
    )
)
FREESOUND_API_KEY = VARIABLES.add(
    Text(name="FREESOUND_API_KEY", doc="Freesound's API key. A secret: never logged nor answered.")
)
FREESOUND_API_URL = VARIABLES.add(
    Text(name="FREESOUND_API_URL", default="https://freesound.org/apiv2", values="URL", doc="Freesound's API base.")
)
MAX_RESPONSE_BYTES = VARIABLES.add(
    Integer(
        name="AUDIO_MAX_RESPONSE_BYTES",
        default=16 * 1024 * 1024,
        minimum=1024,
        doc="The largest output taken from a speech engine or Freesound, in bytes.",
    )
)
PROBE_INTERVAL = VARIABLES.add(
    Seconds(name="AUDIO_PROBE_INTERVAL", default=15.0, doc="How long a provider probe's result is reused.")
)
PROBE_TIMEOUT = VARIABLES.add(Seconds(name="AUDIO_PROBE_TIMEOUT", default=3.0, doc="A probe's deadline."))
PROVIDER_TIMEOUT = VARIABLES.add(
    Seconds(name="AUDIO_PROVIDER_TIMEOUT", default=20.0, doc="A synthesis, search or preview's deadline.")
)
MAX_CONCURRENT_SYNTHESIS = VARIABLES.add(
    Integer(
        name="AUDIO_MAX_CONCURRENT_SYNTHESIS",
        default=4,
        minimum=1,
        maximum=64,
        doc="Speech engine processes at once, per worker.",
    )
)
SYNTHESIS_QUEUE = VARIABLES.add(
    Integer(
        name="AUDIO_SYNTHESIS_QUEUE",
        default=8,
        minimum=0,
        maximum=1000,
        doc="Syntheses that may wait for an engine, per worker; past it a request is refused.",
    )
)
SPEECH_PER_MINUTE = VARIABLES.add(
    Integer(
        name="AUDIO_SPEECH_PER_MINUTE",
        default=30,
        minimum=1,
        maximum=1_000_000,
        doc="Speech requests one client address may make a minute.",
    )
)
SPEECH_PER_ADDRESS = VARIABLES.add(
    Integer(
        name="AUDIO_SPEECH_CONCURRENT_PER_ADDRESS",
        default=2,
        minimum=1,
        maximum=1000,
        doc="Syntheses of one client address at once, per worker.",
    )
)


# Each field is the value of the variable its comment names (declared above, with its meaning).
@dataclass(frozen=True)
class AudioSettings:
    public_origin: str  # AUDIO_PUBLIC_ORIGIN
    tts_provider: str  # AUDIO_TTS_PROVIDER
    espeak_binary: str  # AUDIO_ESPEAK_BINARY
    soundlib_provider: str  # AUDIO_SOUNDLIB_PROVIDER
    soundlib_dir: str  # SOUNDLIB_DIR
    freesound_api_key: str  # FREESOUND_API_KEY
    freesound_api_url: str  # FREESOUND_API_URL
    max_response_bytes: int  # AUDIO_MAX_RESPONSE_BYTES
    probe_interval: float  # AUDIO_PROBE_INTERVAL
    probe_timeout: float  # AUDIO_PROBE_TIMEOUT
    provider_timeout: float  # AUDIO_PROVIDER_TIMEOUT
    max_concurrent_synthesis: int  # AUDIO_MAX_CONCURRENT_SYNTHESIS
    synthesis_queue: int = 8  # AUDIO_SYNTHESIS_QUEUE
    speech_per_minute: int = 30  # AUDIO_SPEECH_PER_MINUTE
    speech_per_address: int = 2  # AUDIO_SPEECH_CONCURRENT_PER_ADDRESS

    @classmethod
    def from_env(cls, data_dir):
        return cls(
            public_origin=PUBLIC_ORIGIN.read().rstrip("/"),
            tts_provider=TTS_PROVIDER.read(),
            espeak_binary=ESPEAK_BINARY.read(),
            soundlib_provider=SOUNDLIB_PROVIDER.read(),
            soundlib_dir=os.path.abspath(SOUNDLIB_DIR.read(os.path.join(data_dir, "soundlib"))),
            freesound_api_key=FREESOUND_API_KEY.read(),
            freesound_api_url=FREESOUND_API_URL.read().rstrip("/"),
            max_response_bytes=MAX_RESPONSE_BYTES.read(),
            probe_interval=PROBE_INTERVAL.read(),
            probe_timeout=PROBE_TIMEOUT.read(),
            provider_timeout=PROVIDER_TIMEOUT.read(),
            max_concurrent_synthesis=MAX_CONCURRENT_SYNTHESIS.read(),
            synthesis_queue=SYNTHESIS_QUEUE.read(),
            speech_per_minute=SPEECH_PER_MINUTE.read(),
            speech_per_address=SPEECH_PER_ADDRESS.read(),
        )
