"""WAV (as espeak-ng writes it) to MP3: the shared encoder of app.common.tts, its
failures as the audio service's ProviderFailed (a 502)."""

from app.audio.providers import ProviderFailed
from app.common import tts

BIT_RATE_KBPS = tts.BIT_RATE_KBPS
encode = tts.encode


def pcm_of_wav(wav):
    try:
        return tts.pcm_of_wav(wav)
    except tts.SpeechFailed as exc:
        raise ProviderFailed(str(exc)) from None


def wav_to_mp3(wav):
    try:
        return tts.wav_to_mp3(wav)
    except tts.SpeechFailed as exc:
        raise ProviderFailed(str(exc)) from None
