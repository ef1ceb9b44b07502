"""Speech with espeak-ng and WAV→MP3 encoding (lameenc), shared by the audio
service (its embedded speech provider) and the notebook's podcasts.

The spec's ranges are the browser speech API's; espeak-ng's own scales:

| field | spec range (normal) | espeak-ng option | mapping |
|---|---|---|---|
| rate | 0.5–2 (1) | `-s` words per minute, 80–450 (175) | 175 × rate → 88–350 |
| pitch | 0–2 (1) | `-p` 0–99 (50) | 50 × pitch, at most 99 |
| volume | 0–1 (1) | `-a` amplitude 0–200 (100) | 100 × volume |
"""

import struct
import subprocess

import lameenc

BIT_RATE_KBPS = 64


class SpeechFailed(Exception):
    """The engine ran and gave no usable audio; the message says why."""


def espeak_arguments(voice_id: str, rate: float = 1.0, pitch: float = 1.0, volume: float = 1.0) -> list[str]:
    return [
        "-v",
        voice_id,
        "-s",
        str(round(175 * rate)),
        "-p",
        str(min(99, round(50 * pitch))),
        "-a",
        str(round(100 * volume)),
        "--stdout",
    ]


def espeak_wav(binary: str, text: str, voice_id: str, timeout: float, rate: float = 1.0, pitch: float = 1.0) -> bytes:
    """The WAV espeak-ng makes of `text` (given on stdin, never as an argument), for
    callers outside a gevent loop (the notebook's job worker)."""
    try:
        done = subprocess.run(
            [binary, *espeak_arguments(voice_id, rate, pitch)],
            input=text.encode(),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise SpeechFailed(f"the speech engine cannot be started ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise SpeechFailed(f"the speech engine took longer than {timeout:g} s") from None
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip()[:200]
        raise SpeechFailed(f"the speech engine failed (exit code {done.returncode}{': ' + error if error else ''})")
    return done.stdout


def pcm_of_wav(wav: bytes) -> tuple[bytes, int, int]:
    """(16-bit PCM bytes, sample rate, channels) of a RIFF/WAVE file. espeak-ng
    streaming to stdout cannot know its length and writes 0x7fff… sizes, so the
    data chunk is taken as everything after its header."""
    if len(wav) < 12 or wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise SpeechFailed("the speech engine did not answer with a WAV file")
    offset, rate, channels = 12, None, 1
    while offset + 8 <= len(wav):
        kind, size = struct.unpack("<4sI", wav[offset : offset + 8])
        body = offset + 8
        if kind == b"fmt ":
            audio_format, channels, rate = struct.unpack("<HHI", wav[body : body + 8])
            bits = struct.unpack("<H", wav[body + 14 : body + 16])[0]
            if audio_format != 1 or bits != 16:
                raise SpeechFailed("the speech engine's WAV is not 16-bit PCM")
        elif kind == b"data":
            if rate is None:
                raise SpeechFailed("the speech engine's WAV has no format chunk")
            end = body + size if body + size <= len(wav) else len(wav)
            return wav[body : end - ((end - body) % (2 * channels))], rate, channels
        offset = body + size + (size & 1)
    raise SpeechFailed("the speech engine's WAV has no audio data")


def encode(pcm: bytes, sample_rate: int, channels: int = 1) -> bytes:
    encoder = lameenc.Encoder()
    encoder.set_bit_rate(BIT_RATE_KBPS)
    encoder.set_in_sample_rate(sample_rate)
    encoder.set_channels(channels)
    encoder.set_quality(7)  # lame: 2 best … 7 fast; twice as fast as 5 at this bit rate, same size
    return bytes(encoder.encode(pcm) + encoder.flush())


def wav_to_mp3(wav: bytes) -> bytes:
    pcm, rate, channels = pcm_of_wav(wav)
    if not pcm:
        raise SpeechFailed("the speech engine produced no audio")
    return encode(pcm, rate, channels)
