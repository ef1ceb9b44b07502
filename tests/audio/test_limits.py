"""Abuse limits of speech on the running service: a flood from one address is refused
at once (429 with Retry-After) while another address is still served, and syntheses
beyond the engine slots and their bounded queue are refused at once (503) instead of
piling up. Outcomes are counted; the engine holds a synthesis (engine.hold, voice
HELD_VOICE) until the test lets it go, so nothing depends on the machine's speed."""

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support.audio import APP, HELD_VOICE, start_audio

ATTACKER, VISITOR = "203.0.113.66", "198.51.100.7"
WAIT = 60  # a bound for a condition that should come at once: never a timing assertion


def speech(audio, address, voice=HELD_VOICE, text="flood"):
    # The service believes X-Real-IP from a loopback peer: that is how nginx names the client.
    return requests.post(
        audio.url + "/speech",
        json={"text": text, "voiceId": voice},
        headers={**APP, "X-Real-IP": address},
        timeout=WAIT + 30,
    )


def wait_until(condition, what):
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)  # polling for a condition


class Flood:
    """Requests sent from a thread pool; answers counted by status as they come."""

    def __init__(self, calls, threads=50):
        self.answers, self._lock = [], threading.Lock()
        self._pool = ThreadPoolExecutor(threads)
        self._futures = [self._pool.submit(self._one, call) for call in calls]

    def _one(self, call):
        response = call()
        with self._lock:
            self.answers.append(response)
        return response

    def count(self, status):
        with self._lock:
            return sum(1 for a in self.answers if a.status_code == status)

    def finish(self):
        self._pool.shutdown(wait=True)
        return Counter(a.status_code for a in self.answers)


def test_a_flood_from_one_address_does_not_keep_another_out(start_service, tmp_path):
    audio = start_audio(
        start_service,
        tmp_path,
        env={
            "AUDIO_SPEECH_PER_MINUTE": "30",
            "AUDIO_SPEECH_CONCURRENT_PER_ADDRESS": "2",
            "AUDIO_MAX_CONCURRENT_SYNTHESIS": "4",
            "AUDIO_SYNTHESIS_QUEUE": "8",
            "AUDIO_PROVIDER_TIMEOUT": "600",
        },
    )
    assert speech(audio, VISITOR, voice="en-us", text="warm").status_code == 200  # voices loaded
    audio.hold_flag.write_text("hold")
    flood = Flood([lambda: speech(audio, ATTACKER)] * 300)
    try:
        # Two of the attacker's requests hold engines; every other one is refused at once.
        wait_until(lambda: flood.count(429) == 298, "298 of 300 flood requests refused")
        visitor = speech(audio, VISITOR, voice="en-us", text="a legitimate request")
        assert visitor.status_code == 200 and visitor.headers["Content-Type"] == "audio/mpeg"
    finally:
        audio.hold_flag.unlink()
    outcomes = flood.finish()
    assert outcomes == {429: 298, 200: 2}, outcomes
    refused = [a for a in flood.answers if a.status_code == 429]
    assert all(int(a.headers["Retry-After"]) >= 1 for a in refused)
    assert all(set(a.json()) == {"error"} and "too many speech requests" in a.json()["error"] for a in refused)
    # Past the 30 a minute (all 270 unless the flood outlasted a minute), the rest at once.
    assert 1 <= sum("a minute" in a.json()["error"] for a in refused) <= 300 - 30
    assert speech(audio, VISITOR, voice="en-us", text="again").status_code == 200


def test_syntheses_beyond_the_slots_and_the_queue_are_refused_at_once(start_service, tmp_path):
    audio = start_audio(
        start_service,
        tmp_path,
        env={"AUDIO_MAX_CONCURRENT_SYNTHESIS": "2", "AUDIO_SYNTHESIS_QUEUE": "3", "AUDIO_PROVIDER_TIMEOUT": "600"},
    )  # a queued request waits for its slot, however long
    assert speech(audio, VISITOR, voice="en-us", text="warm").status_code == 200
    audio.hold_flag.write_text("hold")
    # Ten addresses, one request each: no per-address limit is reached.
    flood = Flood([lambda n=n: speech(audio, f"192.0.2.{n}") for n in range(1, 11)])
    try:
        wait_until(lambda: flood.count(503) == 5, "5 of 10 refused as busy")
        assert flood.count(200) == 0  # 2 hold the engines, 3 wait in the queue
    finally:
        audio.hold_flag.unlink()
    outcomes = flood.finish()
    assert outcomes == {200: 5, 503: 5}, outcomes
    busy = [a for a in flood.answers if a.status_code == 503]
    assert all(a.headers["Retry-After"] == "1" and "busy" in a.json()["error"] for a in busy)
