"""FreesoundLibrary against a local server that speaks Freesound's API v2
(devtools/fake_freesound.py), without gunicorn."""

import time

import pytest

from app.audio.freesound import FreesoundLibrary
from app.audio.providers import PREVIEW_ROUTE, ProviderFailed, TooLarge, Unavailable
from app.audio.settings import AudioSettings
from devtools.fake_freesound import FakeFreesound, silent_mp3

KEY = "s3cret-fs-key-0123456789"
PROBE_TIMEOUT = 0.5
PROVIDER_TIMEOUT = 1.0
MARGIN = 2.0  # slack for a loaded machine: the bounds tell a deadline from none (the slow server takes 5 s)


def settings_for(api_url, key=KEY, max_bytes=64 * 1024, probe_timeout=PROBE_TIMEOUT, provider_timeout=PROVIDER_TIMEOUT):
    return AudioSettings(
        public_origin="",
        tts_provider="espeak",
        espeak_binary="espeak-ng",
        soundlib_provider="freesound",
        soundlib_dir="/nonexistent",
        freesound_api_key=key,
        freesound_api_url=api_url,
        max_response_bytes=max_bytes,
        probe_interval=1.0,
        probe_timeout=probe_timeout,
        provider_timeout=provider_timeout,
        max_concurrent_synthesis=1,
    )


@pytest.fixture
def fake():
    with FakeFreesound(key=KEY) as server:
        yield server


@pytest.fixture
def library(fake):
    return FreesoundLibrary(settings_for(fake.api_url))


def assert_secret_free(exc, key=KEY):
    """Neither the message, the reason nor any chained exception names the key or the header."""
    seen = exc
    while seen is not None:
        for text in (str(seen), repr(seen), str(getattr(seen, "reason", ""))):
            assert key not in text
            assert "Authorization" not in text and "Token " not in text
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)


def failure(call, kind):
    with pytest.raises(kind) as info:
        call()
    assert_secret_free(info.value)
    return info.value


# -- search --------------------------------------------------------------------------


def test_search_is_normalized_to_our_shape(fake, library):
    found = library.search("rain", 10)
    assert [r["id"] for r in found] == ["freesound:1001", "freesound:1002", "freesound:1003"]
    for result in found:
        assert set(result) == {"id", "name", "tags", "duration", "license", "preview_url"}
        assert result["preview_url"] == PREVIEW_ROUTE + result["id"]
        assert isinstance(result["name"], str) and result["name"]
        assert isinstance(result["tags"], list) and all(isinstance(t, str) for t in result["tags"])
        assert "rain" in result["tags"]
        assert isinstance(result["duration"], float)
        assert result["license"].startswith(("http://creativecommons.org/", "https://creativecommons.org/"))
        assert fake.base_url not in str(result)  # never Freesound's own preview URL
    assert found[1] == {
        "id": "freesound:1002",
        "name": "Light rain in the garden",
        "tags": ["rain", "garden", "ambience"],
        "duration": 30.25,
        "license": "https://creativecommons.org/licenses/by/4.0/",
        "preview_url": "/api/audio/soundlib/preview/freesound:1002",
    }


def test_search_asks_for_the_page_size_fields_and_sends_the_token(fake, library):
    assert len(library.search("rain", 2)) == 2
    assert fake.queries == [
        ("/apiv2/search/text/", {"query": "rain", "page_size": "2", "fields": "id,name,tags,duration,license,previews"})
    ]
    assert fake.authorizations == [("/apiv2/search/text/", f"Token {KEY}")]


def test_search_matches_every_word_and_may_find_nothing(library):
    assert [r["id"] for r in library.search("rain thunder", 20)] == ["freesound:1003"]
    assert library.search("helicopter", 20) == []


def test_wrong_key_is_unavailable_everywhere(fake):
    library = FreesoundLibrary(settings_for(fake.api_url, key="wrong-key-" + KEY))
    for call in (library.probe, lambda: library.search("rain", 2), lambda: library.preview("1001")):
        exc = failure(call, Unavailable)
        assert exc.reason == "Freesound rejected the API key"
        assert_secret_free(exc, "wrong-key-" + KEY)
    assert fake.count("/apiv2/") == 3 and fake.count("/previews/") == 0


def test_missing_key_is_unavailable_without_any_request(fake):
    library = FreesoundLibrary(settings_for(fake.api_url, key=""))
    for call in (library.probe, lambda: library.search("rain", 2), lambda: library.preview("1001")):
        assert failure(call, Unavailable).reason == "FREESOUND_API_KEY is not set"
    assert fake.requests == []


def test_a_key_that_cannot_be_a_header_is_refused_without_leaking_it(fake):
    bad = "abc\r\nX-Injected: 1"
    library = FreesoundLibrary(settings_for(fake.api_url, key=bad))
    exc = failure(library.probe, Unavailable)
    assert_secret_free(exc, bad)
    assert "abc" not in str(exc)
    assert fake.requests == []


def test_probe_is_one_small_search(fake, library):
    library.probe()
    assert fake.requests == [("GET", "/apiv2/search/text/")]
    assert fake.queries[0][1]["page_size"] == "1"


def test_probe_reports_the_status_of_other_failures(fake, library):
    fake.down = 503
    assert failure(library.probe, Unavailable).reason == "Freesound answered HTTP 503"
    assert "503" in str(failure(lambda: library.search("rain", 2), ProviderFailed))


def test_a_closed_connection_or_a_gone_server_is_unavailable(fake, library):
    fake.down = True
    assert "cannot be reached" in failure(library.probe, Unavailable).reason
    failure(lambda: library.search("rain", 2), Unavailable)
    fake.stop()
    assert "cannot be reached" in failure(library.probe, Unavailable).reason


def test_malformed_json_is_a_provider_failure(fake, library):
    fake.malformed = True
    assert "malformed JSON" in str(failure(lambda: library.search("rain", 2), ProviderFailed))
    failure(lambda: library.preview("1001"), ProviderFailed)
    failure(library.probe, Unavailable)


# -- deadlines ------------------------------------------------------------------------


def timed(call, kind):
    started = time.monotonic()
    exc = failure(call, kind)
    return exc, time.monotonic() - started


@pytest.mark.parametrize("knob", ["delay", "drip"])
def test_a_slow_search_fails_within_the_deadline(fake, library, knob):
    if knob == "delay":
        fake.delay = 5.0
    else:
        fake.drip = 0.1  # one byte every 0.1 s: each read succeeds, the whole never ends in time
    exc, elapsed = timed(lambda: library.search("rain", 2), ProviderFailed)
    assert str(exc) == f"Freesound did not answer within {PROVIDER_TIMEOUT:g} s"
    assert PROVIDER_TIMEOUT - 0.05 <= elapsed < PROVIDER_TIMEOUT + MARGIN


@pytest.mark.parametrize("knob", ["delay", "drip"])
def test_a_slow_probe_is_unavailable_within_the_probe_deadline(fake, library, knob):
    setattr(fake, knob, 5.0 if knob == "delay" else 0.1)
    exc, elapsed = timed(library.probe, Unavailable)
    assert "did not answer within" in exc.reason
    assert elapsed < PROBE_TIMEOUT + MARGIN


def test_a_dripping_preview_fails_within_one_deadline_for_the_whole_preview(fake, library):
    fake.slow_on = "preview"
    fake.drip = 0.05
    fake.drip_bytes = 16
    exc, elapsed = timed(lambda: library.preview("1001"), ProviderFailed)
    assert "did not answer within" in str(exc)
    assert elapsed < PROVIDER_TIMEOUT + MARGIN
    assert fake.count("/previews/1001-hq.mp3") == 1


# -- preview --------------------------------------------------------------------------


def test_preview_answers_the_hq_mp3_with_its_identity(fake, library):
    content_type, audio, identity = library.preview("1002")
    assert (content_type, identity) == ("audio/mpeg", "freesound:1002")
    assert audio == silent_mp3()
    assert audio[0] == 0xFF and audio[1] & 0xE0 == 0xE0  # MPEG audio frame sync
    assert fake.requests == [("GET", "/apiv2/sounds/1002/"), ("GET", "/previews/1002-hq.mp3")]
    assert fake.queries[0][1] == {"fields": "id,name,previews"}


def test_preview_falls_back_to_the_other_previews(fake, library):
    fake.add_sound(2001, "Only ogg", ["ogg"], 1.0, previews={"preview-lq-ogg": f"{fake.base_url}/previews/1001-lq.ogg"})
    content_type, audio, identity = library.preview("2001")
    assert (content_type, identity) == ("audio/ogg", "freesound:2001")
    assert audio.startswith(b"OggS")
    fake.add_sound(2002, "No previews", ["none"], 1.0, previews={"preview-hq-mp3": ""})
    assert "no preview" in str(failure(lambda: library.preview("2002"), ProviderFailed))


def test_a_preview_that_is_not_audio_is_labelled_as_the_audio_it_should_be(fake, library):
    fake.preview_content_type = "text/html"
    content_type, _, _ = library.preview("1001")
    assert content_type == "audio/mpeg"


@pytest.mark.parametrize("sound_id", ["", "abc", "12a", "../1001", "1001/", "-1", "1" * 16, " 1001", "１００１"])
def test_an_invalid_sound_id_is_unknown_without_any_request(fake, library, sound_id):
    with pytest.raises(LookupError):
        library.preview(sound_id)
    assert fake.requests == []


def test_a_sound_freesound_does_not_know_is_unknown(fake, library):
    with pytest.raises(LookupError):
        library.preview("999999")
    assert fake.requests == [("GET", "/apiv2/sounds/999999/")]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_oversized_preview_is_too_large(fake, declared):
    library = FreesoundLibrary(settings_for(fake.api_url, max_bytes=32 * 1024))
    fake.preview_size = 32 * 1024 + 1
    fake.preview_content_length = declared
    exc = failure(lambda: library.preview("1001"), TooLarge)
    assert "32768 bytes" in str(exc)
    fake.preview_size = 32 * 1024  # exactly at the cap passes
    assert len(library.preview("1001")[1]) == 32 * 1024


def test_a_declared_oversized_preview_fails_before_its_body_is_read(fake):
    library = FreesoundLibrary(settings_for(fake.api_url, max_bytes=32 * 1024, provider_timeout=5.0))
    fake.preview_size = 10 * 1024 * 1024
    fake.slow_on, fake.drip, fake.drip_bytes = "preview", 0.05, 1024  # reading it all would take minutes
    exc, elapsed = timed(lambda: library.preview("1001"), TooLarge)
    assert elapsed < 30  # long before the body could have been read


def test_an_undeclared_oversized_preview_stops_at_the_cap(fake):
    library = FreesoundLibrary(settings_for(fake.api_url, max_bytes=32 * 1024, provider_timeout=5.0))
    fake.preview_size = 10 * 1024 * 1024
    fake.preview_content_length = False
    fake.slow_on, fake.drip, fake.drip_bytes = "preview", 0.05, 16 * 1024 + 16  # chunked pieces of 16 KiB
    exc, elapsed = timed(lambda: library.preview("1001"), TooLarge)
    assert elapsed < 16  # a few chunks, not the 640 of the whole (32 s)


# -- where previews may come from ------------------------------------------------------


def test_a_preview_on_another_host_is_refused_and_never_fetched(fake, library):
    with FakeFreesound(key=KEY) as elsewhere:
        fake.add_sound(
            3001, "Elsewhere", ["x"], 1.0, previews={"preview-hq-mp3": f"{elsewhere.base_url}/previews/1001-hq.mp3"}
        )
        fake.add_sound(
            3002,
            "Redirected",
            ["x"],
            1.0,
            previews={"preview-hq-mp3": f"{fake.base_url}/redirect?to={elsewhere.base_url}/previews/1001-hq.mp3"},
        )
        fake.add_sound(
            3003,
            "Same port, other name",
            ["x"],
            1.0,
            previews={"preview-hq-mp3": f"http://localhost:{fake.port}/previews/1001-hq.mp3"},
        )
        fake.add_sound(
            3004,
            "With credentials",
            ["x"],
            1.0,
            previews={"preview-hq-mp3": f"http://user:pw@127.0.0.1:{fake.port}/previews/1001-hq.mp3"},
        )
        for sound_id in ("3001", "3002", "3003", "3004"):
            exc = failure(lambda sound_id=sound_id: library.preview(sound_id), ProviderFailed)
            assert "not allowed" in str(exc)
        assert elsewhere.requests == []
        assert fake.count("/previews/") == 0
        assert fake.count("/redirect") == 1


@pytest.mark.parametrize(
    "url",
    [
        "http://cdn.freesound.org/previews/1/1001-hq.mp3",  # Freesound, but not over https
        "https://freesound.org.evil.example/previews/1001-hq.mp3",  # looks like it, is not
        "https://evilfreesound.org/previews/1001-hq.mp3",
        "https://cdn.freesound.org:8443/previews/1001-hq.mp3",  # another port
        "https://169.254.169.254/latest/meta-data/",
        "file:///etc/passwd",
        "ftp://cdn.freesound.org/x.mp3",
    ],
)
def test_preview_urls_outside_freesound_are_refused(fake, library, url):
    fake.add_sound(3010, "Outside", ["x"], 1.0, previews={"preview-hq-mp3": url})
    assert "not allowed" in str(failure(lambda: library.preview("3010"), ProviderFailed))
    assert fake.requests == [("GET", "/apiv2/sounds/3010/")]


def test_the_token_goes_with_api_requests_and_same_origin_previews(fake, library):
    library.preview("1001")
    assert fake.authorizations == [("/apiv2/sounds/1001/", f"Token {KEY}"), ("/previews/1001-hq.mp3", f"Token {KEY}")]
