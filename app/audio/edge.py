"""Speech from Microsoft Edge's online voices through edge-tts
(AUDIO_TTS_PROVIDER=edge). edge-tts is asyncio; it runs in a subprocess
(edge_runner) so that it never meets gevent's loop. Its failures (refused,
unreachable, no audio) are "unavailable", never a crash.

edge-tts takes signed integer strings: rate 0.5–2 → "-50%".."+100%",
pitch 0–2 → "-50Hz".."+50Hz", volume 0–1 → "-100%".."+0%".
"""

import json
import sys

from app.audio.process import EngineTimeout, run_engine
from app.audio.providers import ProviderFailed, SpeechProvider, Unavailable
from app.common.config import PROJECT_ROOT


def edge_strings(rate, pitch, volume):
    return {
        "rate": f"{round((rate - 1) * 100):+d}%",
        "pitch": f"{round((pitch - 1) * 50):+d}Hz",
        "volume": f"{round((volume - 1) * 100):+d}%",
    }


class EdgeSpeech(SpeechProvider):
    name = "edge-tts"

    def _run(self, request, timeout):
        try:
            code, output, error = run_engine(
                [sys.executable, "-m", "app.audio.edge_runner"],
                json.dumps(request).encode(),
                timeout,
                self.settings.max_response_bytes,
                "edge-tts",
                cwd=PROJECT_ROOT,
            )
        except EngineTimeout as exc:
            raise Unavailable(str(exc)) from None
        if code != 0:
            raise Unavailable(f"edge-tts failed: {error or f'exit code {code}'}")
        return output

    def _load_voices(self, timeout):
        try:
            return json.loads(self._run({"action": "voices"}, timeout))
        except ValueError:
            raise ProviderFailed("edge-tts answered with a malformed voice list") from None

    def probe(self):
        self._voices = self._load_voices(self.settings.probe_timeout)

    def _speak(self, text, voice_id, rate, pitch, volume):
        audio = self._run(
            {"action": "speak", "text": text, "voice": voice_id, **edge_strings(rate, pitch, volume)},
            self.settings.provider_timeout,
        )
        if not audio:
            raise Unavailable("edge-tts returned no audio")
        return audio
