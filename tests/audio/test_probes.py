"""Readiness probes: one probe for many callers, reused for the interval, and the
provider going away and coming back."""

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import gevent
import pytest
import requests

from app.audio.probes import Probe
from app.audio.providers import Unavailable
from app.audio.seed import seed
from tests.support.audio import start_audio


def test_fifty_concurrent_ready_calls_cost_one_probe_then_the_cache_holds(fresh_audio):
    """The worker probes once as it starts; fifty callers share that probe, and
    the result is reused for the interval."""
    audio = fresh_audio({"AUDIO_PROBE_INTERVAL": "30"})
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: requests.get(audio.url + "/ready", timeout=30), range(50)))
    assert [a.status_code for a in answers] == [200] * 50
    assert audio.probes_run() == 1
    for _ in range(20):
        assert requests.get(audio.url + "/capabilities", timeout=10).json()["speech"]["available"]
    assert audio.probes_run() == 1


def test_an_expired_result_is_answered_at_once_while_one_probe_refreshes_it(fresh_audio):
    audio = fresh_audio({"AUDIO_PROBE_INTERVAL": "1"})
    assert requests.get(audio.url + "/ready", timeout=10).status_code == 200
    deadline = time.monotonic() + 5
    while audio.probes_run() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the start-up probe's log line
    time.sleep(1.1)  # let the interval expire: the behaviour under test is what happens after it
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: requests.get(audio.url + "/ready", timeout=30), range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    deadline = time.monotonic() + 5
    while audio.probes_run() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the engine's log for the refresh
    assert audio.probes_run() == 2


def test_the_engine_going_away_and_coming_back(fresh_audio):
    # A generous deadline: on a loaded machine the reason must still be the engine's own.
    audio = fresh_audio({"AUDIO_PROBE_INTERVAL": "0.5", "AUDIO_PROBE_TIMEOUT": "10"})
    assert requests.get(audio.url + "/ready", timeout=10).status_code == 200
    audio.down_flag.write_text("down")

    def wait_for(status):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            response = requests.get(audio.url + "/ready", timeout=10)
            if response.status_code == status:
                return response
            time.sleep(0.1)  # polling until the next probe interval
        raise AssertionError(f"/ready never answered {status}")

    degraded = wait_for(503).json()
    assert degraded["status"] == "degraded"
    assert degraded["providers"]["speech"]["available"] is False
    assert "the speech engine failed" in degraded["providers"]["speech"]["reason"]
    assert degraded["providers"]["soundlib"]["available"] is True
    refused = audio.speech({"text": "hi", "voiceId": "en-us"})
    assert refused.status_code == 503 and "espeak-ng is unavailable" in refused.json()["error"]
    audio.down_flag.unlink()
    assert wait_for(200).json()["status"] == "ok"
    assert audio.speech({"text": "hi", "voiceId": "en-us"}).status_code == 200


def test_missing_engine_binary_is_unavailable(fresh_audio):
    audio = fresh_audio({"AUDIO_ESPEAK_BINARY": "/nonexistent/espeak-ng"})
    response = requests.get(audio.url + "/ready", timeout=10)
    assert response.status_code == 503
    assert "cannot be started" in response.json()["providers"]["speech"]["reason"]
    assert audio.get("/voices").status_code == 503


def test_edge_without_a_network_is_unavailable_not_a_crash(fresh_audio):
    """The online provider cannot reach its service from this machine: it must
    say so, and speech must be a 503, not a 500 or a fake success."""
    audio = fresh_audio({"AUDIO_TTS_PROVIDER": "edge", "AUDIO_PROBE_TIMEOUT": "10"})
    caps = requests.get(audio.url + "/capabilities", timeout=30).json()
    assert caps["speech"]["provider"] == "edge-tts" and caps["speech"]["available"] is False
    assert caps["speech"]["reason"].startswith("edge-tts")
    assert audio.speech({"text": "hi", "voiceId": "en-US-AriaNeural"}).status_code == 503


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_probe_single_flight_deadline_and_interval():
    clock, calls = FakeClock(), []

    def check():
        calls.append(1)
        gevent.sleep(0.05)

    probe = Probe(check, interval=10, timeout=1, clock=clock)
    results = [g.get() for g in [gevent.spawn(probe.state) for _ in range(30)]]
    assert len(calls) == 1 and all(r.available for r in results)
    clock.now = 9.9
    probe.state()
    assert len(calls) == 1
    clock.now = 10.0
    stale = [probe.state() for _ in range(30)]  # answered at once, from the expired result
    assert all(r is results[0] for r in stale) and probe._inflight is not None
    gevent.sleep(0.1)
    assert len(calls) == 2 and probe.state() is not results[0]

    def slow():
        gevent.sleep(5)

    started = time.monotonic()
    result = Probe(slow, interval=10, timeout=0.2).state()
    assert time.monotonic() - started < 2.5  # at the deadline, not after the probe's 5 s
    assert not result.available and "more than 0.2 s" in result.reason

    def refused():
        raise Unavailable("no key")

    assert Probe(refused, 10, 1).state().reason == "no key"


def test_an_expired_unavailable_result_is_never_answered_the_fresh_probe_is():
    """An admin who fixes a provider sees it at the next probe: past its interval an
    "unavailable" answer is not handed out again while the refresh runs."""
    clock, state = FakeClock(), {"ok": False}

    def check():
        gevent.sleep(0.05)
        if not state["ok"]:
            raise Unavailable("no sound folder")

    probe = Probe(check, interval=10, timeout=1, clock=clock)
    first = probe.state()
    assert not first.available and probe.expires_in(first) == 10
    state["ok"] = True  # the admin creates the folder
    clock.now = 9.9
    assert probe.state() is first  # still within its interval
    clock.now = 10.0
    answers = [g.get() for g in [gevent.spawn(probe.state) for _ in range(20)]]
    assert all(a.available for a in answers) and len({id(a) for a in answers}) == 1


@pytest.mark.parametrize(
    "rate,pitch,volume,expected",
    [
        (1, 1, 1, {"rate": "+0%", "pitch": "+0Hz", "volume": "+0%"}),
        (0.5, 0, 0, {"rate": "-50%", "pitch": "-50Hz", "volume": "-100%"}),
        (2, 2, 0.25, {"rate": "+100%", "pitch": "+50Hz", "volume": "-75%"}),
    ],
)
def test_edge_strings(rate, pitch, volume, expected):
    from app.audio.edge import edge_strings

    assert edge_strings(rate, pitch, volume) == expected


def test_espeak_mapping():
    from app.audio.espeak import espeak_arguments

    assert espeak_arguments("en-us", 1, 1, 1) == ["-v", "en-us", "-s", "175", "-p", "50", "-a", "100", "--stdout"]
    assert espeak_arguments("en", 0.5, 2, 0)[3:8] == ["88", "-p", "99", "-a", "0"]


def test_a_probe_killed_midway_still_answers_and_frees_the_flight():
    def hang():
        gevent.sleep(30)

    probe = Probe(hang, interval=10, timeout=20)
    waiter = gevent.spawn(probe.state)
    gevent.sleep(0.01)
    probe._prober.kill()  # as a worker shutting down would
    result = waiter.get(timeout=2)
    assert not result.available and result.reason == "the probe ended without an answer"
    assert probe._inflight is None


def test_a_synthesis_past_its_deadline_is_502_at_the_deadline(fresh_audio):
    audio = fresh_audio({"AUDIO_PROVIDER_TIMEOUT": "1"})
    audio.slow_flag.write_text("slow")
    started = time.monotonic()
    response = audio.speech({"text": "slow", "voiceId": "en-us"})
    assert response.status_code == 502 and "took more than 1 s" in response.json()["error"]
    assert time.monotonic() - started < 4  # at the 1 s deadline, not after the engine's 5 s
    audio.slow_flag.unlink()
    assert audio.speech({"text": "fast again", "voiceId": "en-us"}).status_code == 200


def test_a_sound_folder_created_after_start_is_available_at_the_next_probe(start_service, tmp_path):
    """The playbook's case: the service probed before the folder existed. The first
    answer after the start-up result's interval is already the fresh one."""
    data_dir = tmp_path / "audio-data"
    data_dir.mkdir()
    audio = start_audio(start_service, data_dir, {"AUDIO_PROBE_INTERVAL": "2"})
    shutil.rmtree(data_dir / "soundlib")  # as if it were seeded after the start
    before = requests.get(audio.url + "/capabilities", timeout=10)
    deadline = time.monotonic() + 10
    while before.json()["soundlib"]["available"] and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for a probe that ran after the folder went away
        before = requests.get(audio.url + "/capabilities", timeout=10)
    assert before.json()["soundlib"]["available"] is False, before.text
    assert before.headers["X-Accel-Expires"] in ("0", "1")  # nginx keeps it no longer than it is fresh
    unavailable_since = time.monotonic()
    seed(str(data_dir / "soundlib"))
    while time.monotonic() - unavailable_since < 2.5:  # past that answer's 2 s interval
        time.sleep(0.1)
    after = requests.get(audio.url + "/capabilities", timeout=10).json()
    assert after["soundlib"]["available"] is True, after
    search = requests.get(
        audio.url + "/soundlib/search", params={"q": "bell"}, headers={"X-App-Request": "1"}, timeout=10
    )
    assert search.status_code == 200 and search.json()["results"]
