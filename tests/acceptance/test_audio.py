"""Audio service, checked through its public address (nginx in front)."""

APP = {"X-App-Request": "1"}


def test_health_ready_and_capabilities(audio):
    assert audio.get("/api/audio/health").json() == {"status": "ok"}
    ready = audio.get("/api/audio/ready")
    assert ready.status_code == 200, ready.text
    caps = audio.get("/api/audio/capabilities").json()
    assert caps["version"] == 1 and caps["speech"]["available"] is True
    assert set(caps["soundlib"]) == {"available", "reason", "provider"}


def test_speech_through_the_proxy(audio):
    voices = audio.get("/api/audio/voices", params={"locale": "en"}, headers=APP).json()["voices"]
    assert voices
    response = audio.post(
        "/api/audio/speech", json={"text": "Acceptance check.", "voiceId": voices[0]["id"]}, headers=APP
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "audio/mpeg" and response.content[:1] in (b"\xff", b"I")
    assert response.headers["Cache-Control"] == "no-store"


def test_rules_hold_through_the_proxy(audio):
    assert audio.get("/api/audio/voices").status_code == 403
    assert audio.get("/api/audio/health", headers={"Origin": "https://evil.example"}).status_code == 403
    big = audio.post("/api/audio/speech", data=b"x" * 9000, headers={**APP, "Content-Type": "application/json"})
    assert big.status_code == 413 and "error" in big.json()


def test_sound_library_search_and_preview(audio):
    caps = audio.get("/api/audio/capabilities").json()
    assert caps["soundlib"]["available"], caps["soundlib"]["reason"]
    results = audio.get("/api/audio/soundlib/search", params={"q": "bell", "results": 3}, headers=APP).json()["results"]
    assert results, "the library has no bell: seed it (make run does)"
    preview = audio.get(results[0]["preview_url"], headers=APP)
    assert preview.status_code == 200 and preview.headers["X-Preview-Identity"] == results[0]["id"]
    assert audio.get(results[0]["preview_url"], headers={**APP, "Range": "bytes=0-1"}).status_code == 416
