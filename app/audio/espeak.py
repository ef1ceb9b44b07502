"""Speech from espeak-ng, the embedded default: a subprocess per request with the
text on stdin (never in its arguments), its WAV read to the end within the
response cap, encoded to MP3. The option mapping (spec ranges to espeak-ng's
scales) and the encoder are shared with the notebook's podcasts: app.common.tts.
"""

from app.audio import mp3
from app.audio.process import EngineTimeout, run_engine
from app.audio.providers import ProviderFailed, SpeechProvider, Unavailable
from app.common.offload import blocking
from app.common.tts import espeak_arguments

PROBE_TEXT = "a"
WAV_TO_MP3_BOUND = 8


def parse_voices(listing):
    """Voices of `espeak-ng --voices` output. mbrola voices (mb/…) need a separate
    engine that is not installed, so they are left out."""
    voices = []
    for line in listing.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5 or parts[4].startswith("mb/"):
            continue
        language, gender, name = parts[1], parts[2].split("/")[-1], parts[3]
        voices.append(
            {
                "id": language,
                "name": name.replace("_", " "),
                "locale": _locale_of(language),
                "gender": {"M": "male", "F": "female"}.get(gender, "unknown"),
            }
        )
    return voices


def _locale_of(language):
    """`en-us` → `en-US`, `cmn-latn-pinyin` stays lower case past the region."""
    parts = language.split("-")
    if len(parts) >= 2 and len(parts[1]) == 2:
        parts[1] = parts[1].upper()
    return "-".join(parts)


class EspeakSpeech(SpeechProvider):
    name = "espeak-ng"

    def _run(self, arguments, stdin, timeout):
        """stdout of espeak-ng within the deadline. Its WAV is about five times the
        size of the MP3 made of it: bounded at eight times the response cap, the MP3
        itself is checked against the cap."""
        try:
            code, output, error = run_engine(
                [self.settings.espeak_binary, *arguments],
                stdin,
                timeout,
                WAV_TO_MP3_BOUND * self.settings.max_response_bytes,
                "the speech engine",
            )
        except OSError as exc:
            raise Unavailable(f"the speech engine cannot be started ({exc.strerror})") from None
        except EngineTimeout as exc:
            raise ProviderFailed(str(exc)) from None
        if code != 0:
            raise ProviderFailed(f"the speech engine failed (exit code {code}{': ' + error if error else ''})")
        return output

    def probe(self):
        wav = self._run(["--stdout"], PROBE_TEXT.encode(), self.settings.probe_timeout)
        if not wav.startswith(b"RIFF"):
            raise Unavailable("the speech engine answered without audio")

    def _load_voices(self, timeout):
        return parse_voices(self._run(["--voices"], None, timeout).decode(errors="replace"))

    def _speak(self, text, voice_id, rate, pitch, volume):
        wav = self._run(espeak_arguments(voice_id, rate, pitch, volume), text.encode(), self.settings.provider_timeout)
        return blocking(mp3.wav_to_mp3, wav)  # encoding is CPU work: off the loop
