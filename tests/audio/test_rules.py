"""The middleware's rules in order, their statuses, and the headers every response carries."""

import pytest
import requests

from tests.support.audio import ORIGIN, raw

APP_ROUTES = ["/voices", "/soundlib/search?q=bell", "/soundlib/preview/local:bell.mp3"]
OPEN_ROUTES = ["/health", "/ready", "/capabilities"]


def test_open_routes_need_no_app_header(audio):
    for path in OPEN_ROUTES:
        response = requests.get(audio.url + path, timeout=30)
        assert response.status_code == 200, path
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Cache-Control"] == "no-store"
    assert requests.get(audio.url + "/health", timeout=10).json() == {"status": "ok"}


@pytest.mark.parametrize("path", APP_ROUTES)
def test_app_routes_need_x_app_request_1(audio, path):
    for headers in ({}, {"X-App-Request": "0"}, {"X-App-Request": "true"}):
        response = requests.get(audio.url + path, headers=headers, timeout=10)
        assert response.status_code == 403 and response.json()["field"] == "X-App-Request"
        assert response.headers["Cache-Control"] == "no-store"
    assert audio.get(path).status_code == 200
    no_header = requests.post(audio.url + "/speech", json={"text": "x", "voiceId": "en-us"}, timeout=10)
    assert no_header.status_code == 403


@pytest.mark.parametrize("path", OPEN_ROUTES + APP_ROUTES)
def test_an_origin_must_match_exactly(audio, path):
    for origin in ("https://evil.example", ORIGIN + "/", ORIGIN.upper(), "null", ORIGIN + ":443"):
        response = audio.get(path, headers={"Origin": origin})
        assert response.status_code == 403, (path, origin)
        assert response.json() == {"error": "this origin is not allowed", "field": "Origin"}
    assert audio.get(path, headers={"Origin": ORIGIN}).status_code == 200


def test_origin_is_checked_before_the_app_header(audio):
    response = requests.get(audio.url + "/voices", headers={"Origin": "https://evil.example"}, timeout=10)
    assert response.json()["field"] == "Origin"


def test_speech_needs_exactly_application_json(audio):
    body = b'{"text": "x", "voiceId": "en-us"}'
    for content_type in ("text/plain", "application/json; charset=utf-8", "Application/JSON", None):
        headers = {"X-App-Request": "1", **({"Content-Type": content_type} if content_type else {})}
        response = requests.post(audio.url + "/speech", data=body, headers=headers, timeout=10)
        assert response.status_code == 415, content_type
        assert response.json()["field"] == "Content-Type"


def test_bodies_over_8192_bytes_are_413_with_or_without_a_length(audio):
    headers = {"X-App-Request": "1", "Content-Type": "application/json"}
    over = b'{"text": "' + b"x" * 8161 + b'", "voiceId": "en-us"}'
    assert len(over) == 8193
    status, body, _ = raw(audio, "POST", "/speech", headers, body=over)
    assert status == 413 and b"too large" in body
    status, body, _ = raw(audio, "POST", "/speech", headers, chunks=[over[:4000], over[4000:]])
    assert status == 413
    at_limit = over[:10] + over[11:]  # 8192 bytes: passes the size rule, then fails on text length
    status, body, _ = raw(audio, "POST", "/speech", headers, chunks=[at_limit[:5000], at_limit[5000:]])
    assert status == 400 and b'"field":"text"' in body


def test_range_on_preview_is_416(audio):
    response = audio.get("/soundlib/preview/local:bell.mp3", headers={"Range": "bytes=0-99"})
    assert response.status_code == 416 and response.json()["field"] == "Range"


@pytest.mark.parametrize(
    "params,field",
    [
        ({}, "q"),
        ({"q": ""}, "q"),
        ({"q": "x" * 121}, "q"),
        ({"q": "bell", "results": "0"}, "results"),
        ({"q": "bell", "results": "21"}, "results"),
        ({"q": "bell", "results": "two"}, "results"),
    ],
)
def test_search_parameters(audio, params, field):
    response = audio.get("/soundlib/search", params=params)
    assert response.status_code == 400 and response.json()["field"] == field


def test_search_bounds_pass(audio):
    assert audio.get("/soundlib/search", params={"q": "x" * 120, "results": "20"}).status_code == 200
    assert len(audio.get("/soundlib/search", params={"q": "notification", "results": "1"}).json()["results"]) == 1


def test_unknown_routes_are_json_404(audio):
    response = audio.get("/nope")
    assert response.status_code == 404 and "error" in response.json()
