"""Speech through the service's routes, in process: real espeak-ng, MP3 out, every bound."""

import io

import pytest
from mutagen.mp3 import MP3

pytestmark = pytest.mark.in_process


def mp3_duration(data):
    assert data[:2] == b"\xff\xf3" or data[:2] == b"\xff\xfb" or data[:3] == b"ID3", data[:4]
    assert data[0] == 0xFF and data[1] & 0xE0 == 0xE0  # MPEG frame sync
    return MP3(io.BytesIO(data)).info.length


def test_speech_is_mp3_and_lasts_with_the_text(audio):
    short = audio.speech({"text": "Hello there.", "voiceId": "en-us"})
    assert short.status_code == 200, short.text
    assert short.headers["Content-Type"] == "audio/mpeg"
    assert short.headers["X-Content-Type-Options"] == "nosniff" and short.headers["Cache-Control"] == "no-store"
    text = "Hello there. " * 13  # 169 characters
    long = audio.speech({"text": text, "voiceId": "en-us"})
    assert long.status_code == 200
    short_s, long_s = mp3_duration(short.content), mp3_duration(long.content)
    assert 0.3 < short_s < 3
    assert 6 < long_s / short_s < 25, (short_s, long_s)


def test_rate_changes_the_duration(audio):
    text = "The quick brown fox jumps over the lazy dog."
    slow = mp3_duration(audio.speech({"text": text, "voiceId": "en-us", "rate": 0.5}).content)
    fast = mp3_duration(audio.speech({"text": text, "voiceId": "en-us", "rate": 2}).content)
    assert slow > 2.5 * fast, (slow, fast)


@pytest.mark.parametrize(
    "field,value",
    [
        ("rate", 0.5),
        ("rate", 2),
        ("pitch", 0),
        ("pitch", 2),
        ("volume", 0),
        ("volume", 1),
        ("text", "x" * 180),
        ("locale", "e" * 35),
    ],
)
def test_values_at_the_edges_pass(audio, field, value):
    response = audio.speech({"text": "edge", "voiceId": "en-us", field: value})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "body,field",
    [
        ({"text": "x", "voiceId": "en-us", "rate": 0.49}, "rate"),
        ({"text": "x", "voiceId": "en-us", "rate": 2.01}, "rate"),
        ({"text": "x", "voiceId": "en-us", "rate": "1"}, "rate"),
        ({"text": "x", "voiceId": "en-us", "rate": True}, "rate"),
        ({"text": "x", "voiceId": "en-us", "pitch": -0.01}, "pitch"),
        ({"text": "x", "voiceId": "en-us", "pitch": 2.01}, "pitch"),
        ({"text": "x", "voiceId": "en-us", "volume": 1.01}, "volume"),
        ({"text": "x", "voiceId": "en-us", "volume": None}, "volume"),
        ({"text": "", "voiceId": "en-us"}, "text"),
        ({"text": "x" * 181, "voiceId": "en-us"}, "text"),
        ({"text": 5, "voiceId": "en-us"}, "text"),
        ({"voiceId": "en-us"}, "text"),
        ({"text": "x"}, "voiceId"),
        ({"text": "x", "voiceId": "v" * 121}, "voiceId"),
        ({"text": "x", "voiceId": "no-such-voice"}, "voiceId"),
        ({"text": "x", "voiceId": "en-us", "locale": "e" * 36}, "locale"),
        ({"text": "x", "voiceId": "en-us", "extra": 1}, "extra"),
    ],
)
def test_bad_values_are_400_naming_the_field(audio, body, field):
    response = audio.speech(body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field and response.json()["error"].startswith(f"{field}:")


def test_non_object_bodies(audio):
    for data in (b"[1]", b"nope", b"\xff"):
        response = audio.speech(None, data=data, headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and "error" in response.json()


def test_voices_filtered_by_locale(audio):
    every = audio.get("/voices").json()
    assert every["provider"] == "espeak-ng" and len(every["voices"]) > 50
    english = audio.get("/voices", params={"locale": "en"}).json()["voices"]
    assert english and all(v["locale"].lower().startswith("en") for v in english)
    american = audio.get("/voices", params={"locale": "en_us"}).json()["voices"]
    assert {"id": "en-us", "name": "English (America)", "locale": "en-US", "gender": "male"} in american
    assert all(v["locale"].lower().startswith("en-us") for v in american)
    assert audio.get("/voices", params={"locale": "zz"}).json()["voices"] == []
    too_long = audio.get("/voices", params={"locale": "e" * 36})
    assert too_long.status_code == 400 and too_long.json()["field"] == "locale"
