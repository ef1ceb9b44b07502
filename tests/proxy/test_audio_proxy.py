"""The audio service behind real nginx: the probe routes' micro-cache, the body
limit, and the rules passing through."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.audio import APP, ORIGIN, start_audio
from tests.support.decks import burst_until_refused, request_from


@pytest.fixture
def proxied_audio(start_service, nginx_for, tmp_path):
    log_path = tmp_path / "audio.stderr"
    with open(log_path, "wb") as log:
        audio = start_audio(lambda *a, **k: start_service(*a, stderr=log, **k), tmp_path)
    proxy = nginx_for(audio.service)
    return audio, proxy, log_path


def ready_lines(log_path):
    return [line for line in log_path.read_text().splitlines() if "GET /api/audio/ready " in line]


def test_a_flood_of_ready_calls_is_answered_by_the_proxy(proxied_audio):
    audio, proxy, log_path = proxied_audio
    url = proxy.url + "/api/audio/ready"
    headers = proxy.headers("audio")
    started = time.monotonic()
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: requests.get(url, headers=headers, timeout=30), range(100)))
    took = time.monotonic() - started
    assert [a.status_code for a in answers] == [200] * 100
    assert all(a.headers["Cache-Control"] == "no-store" for a in answers)  # clients still must not cache
    statuses = {a.headers["X-Cache-Status"] for a in answers}
    assert "HIT" in statuses and statuses <= {"HIT", "MISS", "EXPIRED"}  # never a stale answer
    reached = len(ready_lines(log_path))
    # About one per second of the flood, however long this machine took to send it.
    assert 1 <= reached <= int(took) + 2, f"{reached} of 100 reached the service in {took:.1f} s"


def test_the_cache_keeps_origins_apart_and_expires(proxied_audio):
    audio, proxy, log_path = proxied_audio
    url = proxy.url + "/api/audio/capabilities"
    good = requests.get(url, headers=proxy.headers("audio", Origin=ORIGIN), timeout=10)
    bad = requests.get(url, headers=proxy.headers("audio", Origin="https://evil.example"), timeout=10)
    assert good.status_code == 200 and bad.status_code == 403  # not the other origin's cached answer
    assert requests.get(proxy.url + "/api/audio/ready", headers=proxy.headers("audio"), timeout=10).status_code == 200
    before = len(ready_lines(log_path))
    deadline = time.monotonic() + 5
    while len(ready_lines(log_path)) == before and time.monotonic() < deadline:
        requests.get(proxy.url + "/api/audio/ready", headers=proxy.headers("audio"), timeout=10)
        time.sleep(0.2)  # asking again until the one-second entry expires
    assert len(ready_lines(log_path)) > before, "the cached answer never expired"


def test_rules_and_limits_through_the_proxy(proxied_audio):
    audio, proxy, _ = proxied_audio
    speech = proxy.url + "/api/audio/speech"
    headers = proxy.headers("audio", **{"X-App-Request": "1", "Content-Type": "application/json"})
    ok = requests.post(speech, json={"text": "through nginx", "voiceId": "en-us"}, headers=headers, timeout=30)
    assert ok.status_code == 200 and ok.headers["Content-Type"] == "audio/mpeg"
    assert "X-Cache-Status" not in ok.headers  # only the probe routes are cached
    big = requests.post(speech, data=b"x" * 8193, headers=headers, timeout=10)
    assert big.status_code == 413 and "8192 bytes" in big.json()["error"]
    ranged = requests.get(
        proxy.url + "/api/audio/soundlib/preview/local:bell.mp3",
        headers=proxy.headers("audio", **{"X-App-Request": "1", "Range": "bytes=0-9"}),
        timeout=10,
    )
    assert ranged.status_code == 416


def test_a_burst_of_speech_is_refused_per_address_and_another_is_served(proxied_audio):
    audio, proxy, log_path = proxied_audio
    # Without X-App-Request the service refuses at once (403): cheap, and nginx counts it all the same.
    answers = burst_until_refused(
        lambda: request_from(
            proxy.port, "127.0.0.2", "POST", "/api/audio/speech", "audio.localhost", {"text": "x", "voiceId": "en-us"}
        )
    )
    assert {status for status, _, _ in answers} <= {403, 429}
    for status, headers, body in answers:
        if status == 429:
            assert headers["retry-after"] == "1"
            assert json.loads(body) == {"error": "too many requests from this address, slow down"}
    status, headers, body = request_from(
        proxy.port,
        "127.0.0.3",
        "POST",
        "/api/audio/speech",
        "audio.localhost",
        {"text": "a legitimate request", "voiceId": "en-us"},
        APP,
    )
    assert status == 200 and headers["content-type"] == "audio/mpeg"
