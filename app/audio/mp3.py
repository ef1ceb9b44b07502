"""WAV (as espeak-ng writes it) to MP3, with lameenc."""
import struct

import lameenc

from app.audio.providers import ProviderFailed

BIT_RATE_KBPS = 64


def pcm_of_wav(wav):
    """(16-bit PCM bytes, sample rate, channels) of a RIFF/WAVE file. espeak-ng
    streaming to stdout cannot know its length and writes 0x7fff… sizes, so the
    data chunk is taken as everything after its header."""
    if len(wav) < 12 or wav[:4] != b"RIFF" or wav[8:12] != b"WAVE":
        raise ProviderFailed("the speech engine did not answer with a WAV file")
    offset, rate, channels = 12, None, None
    while offset + 8 <= len(wav):
        kind, size = struct.unpack("<4sI", wav[offset:offset + 8])
        body = offset + 8
        if kind == b"fmt ":
            audio_format, channels, rate = struct.unpack("<HHI", wav[body:body + 8])
            bits = struct.unpack("<H", wav[body + 14:body + 16])[0]
            if audio_format != 1 or bits != 16:
                raise ProviderFailed("the speech engine's WAV is not 16-bit PCM")
        elif kind == b"data":
            if rate is None:
                raise ProviderFailed("the speech engine's WAV has no format chunk")
            end = body + size if body + size <= len(wav) else len(wav)
            return wav[body:end - ((end - body) % (2 * channels))], rate, channels
        offset = body + size + (size & 1)
    raise ProviderFailed("the speech engine's WAV has no audio data")


def encode(pcm, sample_rate, channels=1):
    encoder = lameenc.Encoder()
    encoder.set_bit_rate(BIT_RATE_KBPS)
    encoder.set_in_sample_rate(sample_rate)
    encoder.set_channels(channels)
    encoder.set_quality(7)  # lame: 2 best … 7 fast; twice as fast as 5 at this bit rate, same size
    return bytes(encoder.encode(pcm) + encoder.flush())


def wav_to_mp3(wav):
    pcm, rate, channels = pcm_of_wav(wav)
    if not pcm:
        raise ProviderFailed("the speech engine produced no audio")
    return encode(pcm, rate, channels)
