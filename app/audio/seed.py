"""Sounds the bundle makes itself, so the embedded library works out of the box
(`make run` seeds DATA_DIR/soundlib with them): tones synthesized here and one
phrase spoken by espeak-ng, encoded to MP3, each with a sidecar of tags."""

import json
import math
import os
import random
import shutil
import struct
import subprocess

from app.audio import mp3

RATE = 22050


def _pcm(samples):
    return b"".join(struct.pack("<h", max(-32767, min(32767, int(v * 32767)))) for v in samples)


def _tone(freqs, seconds, decay):
    n = int(RATE * seconds)
    return [
        sum(math.sin(2 * math.pi * f * i / RATE) for f in freqs) / len(freqs) * 0.6 * math.exp(-decay * i / RATE)
        for i in range(n)
    ]


def _rain(seconds):
    rng, value, out = random.Random(7), 0.0, []
    for _ in range(int(RATE * seconds)):
        value = 0.92 * value + 0.08 * rng.uniform(-1, 1)  # a low-passed noise
        out.append(value * 2.5)
    return out


def _chime():
    notes = (523.25, 659.25, 783.99, 1046.5)
    out = []
    for note in notes:
        out += _tone((note, note * 2), 0.35, 4.0)
    return out


SOUNDS = {
    "bell": (lambda: _tone((880.0, 1760.0, 2640.0), 2.0, 2.5), ["bell", "ring", "notification"]),
    "beep": (lambda: _tone((1000.0,), 0.3, 0.0), ["beep", "alert", "tone"]),
    "rain": (lambda: _rain(4.0), ["rain", "weather", "ambience", "noise"]),
    "chime": (_chime, ["chime", "arpeggio", "success", "notification"]),
}


def seed(directory, espeak_binary="espeak-ng"):
    """Write the seed sounds into `directory` (kept if already there). Returns the names written."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, (make, tags) in SOUNDS.items():
        if _write(directory, name, lambda make=make: mp3.encode(_pcm(make()), RATE), tags):
            written.append(name)
    if shutil.which(espeak_binary):

        def spoken():
            wav = subprocess.run(
                [espeak_binary, "--stdout"],
                input=b"Welcome to the audio service.",
                capture_output=True,
                check=True,
                timeout=30,
            ).stdout
            return mp3.wav_to_mp3(wav)

        if _write(directory, "spoken welcome", spoken, ["voice", "speech", "welcome"]):
            written.append("spoken welcome")
    return written


def _write(directory, name, make_mp3, tags):
    stem = os.path.join(directory, name.replace(" ", "-"))
    if os.path.exists(stem + ".mp3"):
        return False
    with open(stem + ".mp3", "wb") as f:
        f.write(make_mp3())
    with open(stem + ".json", "w") as f:
        json.dump({"name": name, "tags": tags, "license": "CC0 (made by the bundle)"}, f)
    return True
