"""The Freesound sound library through the running service (gunicorn, gevent
worker) against a local server that speaks Freesound's API v2."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from devtools.fake_freesound import FakeFreesound, silent_mp3
from devtools.waiting import wait_for

KEY = "test-key"
APP = {"X-App-Request": "1"}
PROVIDER_TIMEOUT = 2.0
MARGIN = 1.5  # scheduling slack; far below the slow server's 6 s
MAX_BYTES = 64 * 1024


def env_for(fake, **extra):
    return {
        "AUDIO_SOUNDLIB_PROVIDER": "freesound",
        "FREESOUND_API_KEY": KEY,
        "FREESOUND_API_URL": fake.api_url,
        "AUDIO_PROBE_INTERVAL": "0.5",
        "AUDIO_PROVIDER_TIMEOUT": str(PROVIDER_TIMEOUT),
        **extra,
    }


def get(service, path, headers=APP, **kwargs):
    return requests.get(f"{service.base_url}/api/audio{path}", headers=headers, timeout=30, **kwargs)


def soundlib(service):
    response = get(service, "/capabilities", headers={})
    assert response.status_code == 200
    return response.json()["soundlib"]


def assert_secured(response):
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Cache-Control"] == "no-store"


@pytest.fixture(scope="module")
def shared_fake():
    with FakeFreesound(key=KEY) as server:
        yield server


@pytest.fixture
def fake(shared_fake):
    """The module's fake with its knobs back to their defaults after each test."""
    yield shared_fake
    for knob, value in (
        ("delay", 0.0),
        ("drip", 0.0),
        ("drip_bytes", 1),
        ("drip_headers", False),
        ("slow_on", "all"),
        ("preview_size", None),
        ("preview_content_length", True),
        ("preview_content_type", "audio/mpeg"),
        ("down", False),
        ("malformed", False),
    ):
        setattr(shared_fake, knob, value)


@pytest.fixture(scope="module")
def service(start_module_service, shared_fake):
    """One service for the module's data-path tests. Its probe result is reused for
    a minute, so that a slow or broken fake shows in the call under test (502)
    rather than in the capability check before it (503)."""
    return start_module_service(
        "audio", env=env_for(shared_fake, AUDIO_PROBE_INTERVAL="60", AUDIO_MAX_RESPONSE_BYTES=str(MAX_BYTES))
    )


# -- search and preview ------------------------------------------------------------------


def test_capabilities_report_freesound_available(service):
    assert soundlib(service) == {"available": True, "reason": None, "provider": "freesound"}


def test_search_answers_normalized_results(service, fake):
    response = get(service, "/soundlib/search", params={"q": "rain", "results": "2"})
    assert response.status_code == 200, response.text
    assert_secured(response)
    body = response.json()
    assert body["provider"] == "freesound"
    assert body["results"] == [
        {
            "id": "freesound:1001",
            "name": "Heavy rain on a tin roof",
            "tags": ["rain", "roof", "storm", "field-recording"],
            "duration": 12.5,
            "license": "http://creativecommons.org/publicdomain/zero/1.0/",
            "preview_url": "/api/audio/soundlib/preview/freesound:1001",
        },
        {
            "id": "freesound:1002",
            "name": "Light rain in the garden",
            "tags": ["rain", "garden", "ambience"],
            "duration": 30.25,
            "license": "https://creativecommons.org/licenses/by/4.0/",
            "preview_url": "/api/audio/soundlib/preview/freesound:1002",
        },
    ]
    assert fake.queries[-1] == (
        "/apiv2/search/text/",
        {"query": "rain", "page_size": "2", "fields": "id,name,tags,duration,license,previews"},
    )
    assert fake.authorizations[-1] == ("/apiv2/search/text/", f"Token {KEY}")


def test_search_without_matches_is_an_empty_list(service):
    response = get(service, "/soundlib/search", params={"q": "helicopter", "results": "20"})
    assert response.status_code == 200 and response.json()["results"] == []


def test_preview_answers_the_audio_with_its_identity(service, fake):
    response = get(service, "/soundlib/preview/freesound:1003")
    assert response.status_code == 200, response.text
    assert_secured(response)
    assert response.headers["X-Preview-Identity"] == "freesound:1003"
    assert response.headers["Content-Type"] == "audio/mpeg"
    assert response.content == silent_mp3()
    assert fake.requests[-2:] == [("GET", "/apiv2/sounds/1003/"), ("GET", "/previews/1003-hq.mp3")]


def test_a_preview_that_is_not_audio_is_never_answered_as_a_page(service, fake):
    fake.preview_content_type = "text/html"
    response = get(service, "/soundlib/preview/freesound:1003")
    assert response.status_code == 200 and response.headers["Content-Type"] == "audio/mpeg"


def test_unknown_sounds_are_404(service, fake):
    before = len(fake.requests)
    for sound in ("freesound:999999", "freesound:abc", "freesound:12%2F..%2F1", "local:rain.mp3"):
        response = get(service, f"/soundlib/preview/{sound}")
        assert response.status_code == 404, (sound, response.text)
        assert set(response.json()) <= {"error", "field"}
    assert fake.requests[before:] == [("GET", "/apiv2/sounds/999999/")]


def test_a_preview_url_on_another_host_is_502_and_never_fetched(service, fake):
    with FakeFreesound(key=KEY) as elsewhere:
        fake.add_sound(
            5001,
            "Elsewhere",
            ["elsewhere"],
            1.0,
            previews={"preview-hq-mp3": f"{elsewhere.base_url}/previews/1001-hq.mp3"},
        )
        response = get(service, "/soundlib/preview/freesound:5001")
        assert response.status_code == 502
        assert "not allowed" in response.json()["error"]
        assert elsewhere.requests == []


# -- slow, broken and oversized answers ----------------------------------------------------


def timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


@pytest.mark.parametrize("slowness", ["delay", "drip", "drip-headers"])
def test_a_slow_search_is_502_within_the_deadline(service, fake, slowness):
    soundlib(service)  # the probe result is fresh and reused: the search itself meets the slow server
    fake.slow_on = "api"
    if slowness == "delay":
        fake.delay = 6.0
    else:
        fake.drip = 0.2
        fake.drip_headers = slowness == "drip-headers"  # only the gevent deadline stops this one
    response, elapsed = timed(lambda: get(service, "/soundlib/search", params={"q": "rain", "results": "2"}))
    assert response.status_code == 502
    assert response.json() == {"error": f"Freesound did not answer within {PROVIDER_TIMEOUT:g} s"}
    assert_secured(response)
    assert elapsed < PROVIDER_TIMEOUT + MARGIN


def test_a_slow_preview_is_502_within_the_deadline(service, fake):
    fake.slow_on, fake.drip, fake.drip_bytes = "preview", 0.1, 8
    response, elapsed = timed(lambda: get(service, "/soundlib/preview/freesound:1001"))
    assert response.status_code == 502 and "did not answer within" in response.json()["error"]
    assert elapsed < PROVIDER_TIMEOUT + MARGIN


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_oversized_preview_is_502(service, fake, declared):
    fake.preview_size = MAX_BYTES + 1
    fake.preview_content_length = declared
    response = get(service, "/soundlib/preview/freesound:1001")
    assert response.status_code == 502
    assert response.json() == {"error": f"Freesound's preview is larger than the limit of {MAX_BYTES} bytes"}
    fake.preview_size = MAX_BYTES
    response = get(service, "/soundlib/preview/freesound:1001")
    assert response.status_code == 200 and len(response.content) == MAX_BYTES


def test_malformed_answers_and_errors_are_502(service, fake):
    fake.malformed = True
    response = get(service, "/soundlib/search", params={"q": "rain"})
    assert response.status_code == 502 and response.json() == {"error": "Freesound answered with malformed JSON"}
    fake.malformed = False
    fake.down = 500
    response = get(service, "/soundlib/search", params={"q": "rain"})
    assert response.status_code == 502 and response.json() == {"error": "Freesound answered HTTP 500"}


# -- the key ---------------------------------------------------------------------------------


def test_a_wrong_key_is_503_and_never_shown(start_service, fake, tmp_path):
    wrong = "wrong-key-5f1d2c"
    log_path = tmp_path / "service.log"
    with open(log_path, "wb") as log:
        service = start_service("audio", env=env_for(fake, FREESOUND_API_KEY=wrong), stdout=log, stderr=log)
        state = soundlib(service)
        assert state == {"available": False, "reason": "Freesound rejected the API key", "provider": "freesound"}
        search = get(service, "/soundlib/search", params={"q": "rain", "results": "2"})
        assert search.status_code == 503
        assert set(search.json()) == {"error"} and "rejected the API key" in search.json()["error"]
        assert_secured(search)
        preview = get(service, "/soundlib/preview/freesound:1001")
        assert preview.status_code == 503
        ready = get(service, "/ready", headers={})
        for response in (search, preview, ready, get(service, "/capabilities", headers={})):
            assert wrong not in response.text and wrong not in str(response.headers)
        assert fake.authorizations[-1][1] == f"Token {wrong}"  # it was sent, to Freesound only
        service.stop()
    assert wrong not in log_path.read_text(errors="replace")


def test_a_missing_key_is_unavailable_without_asking_freesound(start_service, fake):
    before = len(fake.requests)
    service = start_service("audio", env=env_for(fake, FREESOUND_API_KEY=""))
    assert soundlib(service) == {"available": False, "reason": "FREESOUND_API_KEY is not set", "provider": "freesound"}
    search = get(service, "/soundlib/search", params={"q": "rain"})
    assert search.status_code == 503 and "FREESOUND_API_KEY is not set" in search.json()["error"]
    assert len(fake.requests) == before


# -- probes ------------------------------------------------------------------------------------


def probes(fake):
    """Probe requests the fake received (a search for one id only)."""
    return sum(1 for path, query in list(fake.queries) if path == "/apiv2/search/text/" and query.get("fields") == "id")


def test_concurrent_capability_checks_cost_freesound_one_probe(start_service, fake):
    """The worker probes as it starts; thirty callers within the interval add nothing."""
    before = probes(fake)
    service = start_service("audio", env=env_for(fake, AUDIO_PROBE_INTERVAL="60"))
    with ThreadPoolExecutor(30) as pool:
        states = list(pool.map(lambda _: soundlib(service), range(30)))
    assert all(state["available"] for state in states)
    assert probes(fake) - before == 1


def test_freesound_going_away_and_coming_back_flips_the_capability(start_service, fake):
    # A going-away Freesound closes connections at once: no short probe deadline is
    # needed, and a short one would fail espeak-ng's probe on a loaded machine.
    service = start_service("audio", env=env_for(fake, AUDIO_PROBE_TIMEOUT="10"))
    assert soundlib(service)["available"] is True
    fake.down = True
    gone = wait_for(
        lambda: (lambda s: s if not s["available"] else None)(soundlib(service)), what="soundlib becoming unavailable"
    )
    assert "cannot be reached" in gone["reason"] and KEY not in gone["reason"]
    search = get(service, "/soundlib/search", params={"q": "rain"})
    assert search.status_code == 503 and "cannot be reached" in search.json()["error"]
    assert get(service, "/ready", headers={}).status_code == 200  # speech does not depend on it
    fake.down = False
    wait_for(lambda: soundlib(service)["available"], what="soundlib becoming available again")
    search = get(service, "/soundlib/search", params={"q": "rain"})
    assert search.status_code == 200 and len(search.json()["results"]) == 3


def test_a_slow_freesound_makes_the_capability_unavailable_within_the_probe_deadline(start_service, fake):
    service = start_service("audio", env=env_for(fake, AUDIO_PROBE_TIMEOUT="1"))
    assert soundlib(service)["available"] is True
    fake.slow_on, fake.delay = "api", 6.0
    started = time.monotonic()
    state = wait_for(
        lambda: (lambda s: s if not s["available"] else None)(soundlib(service)), what="soundlib becoming unavailable"
    )
    assert "1 s" in state["reason"]  # the probe's deadline (the probe runner's words or the provider's)
    assert time.monotonic() - started < fake.delay  # a probe that waited for the slow server takes this long
