"""The embedded sound library: search, preview, changes on disk, traversal."""

import json
import shutil

from tests.support.audio import raw, start_audio


def test_search_by_name_and_tag_words(audio):
    found = audio.get("/soundlib/search", params={"q": "notification"}).json()
    assert found["provider"] == "local"
    assert [r["name"] for r in found["results"]] == ["bell", "chime"]
    bell = found["results"][0]
    assert set(bell) == {"id", "name", "tags", "duration", "license", "preview_url"}
    assert bell["id"] == "local:bell.mp3" and bell["preview_url"] == "/api/audio/soundlib/preview/local:bell.mp3"
    assert 1.9 < bell["duration"] < 2.2 and "ring" in bell["tags"]
    results = audio.get("/soundlib/search", params={"q": "rain weather"}).json()["results"]
    assert [r["name"] for r in results] == ["rain"]
    assert audio.get("/soundlib/search", params={"q": "rain bell"}).json()["results"] == []
    results = audio.get("/soundlib/search", params={"q": "SPOK"}).json()["results"]
    assert [r["name"] for r in results] == ["spoken welcome"]


def test_preview_answers_the_file_with_its_identity(audio):
    response = audio.get("/soundlib/preview/local:chime.mp3")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "audio/mpeg"
    assert response.headers["X-Preview-Identity"] == "local:chime.mp3"
    assert response.content == (audio.service.data_dir / "soundlib" / "chime.mp3").read_bytes()


def test_preview_of_unknown_or_escaping_ids_is_404(audio):
    for path in [
        "/soundlib/preview/local:nope.mp3",
        "/soundlib/preview/local:../audio-data/engine.log",
        "/soundlib/preview/local:/etc/passwd",
        "/soundlib/preview/local:bell.json",
        "/soundlib/preview/freesound:123",
        "/soundlib/preview/bell.mp3",
        "/soundlib/preview/local:",
    ]:
        status, body, _ = raw(audio, "GET", path, {"X-App-Request": "1"})
        assert status == 404, (path, body)
        assert "error" in json.loads(body)


def test_library_follows_changes_on_disk(fresh_audio):
    audio = fresh_audio()
    folder = audio.service.data_dir / "soundlib"
    assert audio.get("/soundlib/search", params={"q": "thunder"}).json()["results"] == []
    shutil.copy(folder / "rain.mp3", folder / "storm.mp3")
    (folder / "storm.json").write_text(json.dumps({"tags": ["thunder"], "license": "CC-BY"}))
    (folder / "notes.txt").write_text("not audio")
    deadline_results = []
    for _ in range(100):  # the index is re-checked every 2 s at most
        deadline_results = audio.get("/soundlib/search", params={"q": "thunder"}).json()["results"]
        if deadline_results:
            break
        __import__("time").sleep(0.1)  # polling the service for the change
    assert [(r["name"], r["license"]) for r in deadline_results] == [("storm", "CC-BY")]
    (folder / "storm.mp3").unlink()
    for _ in range(100):
        if not audio.get("/soundlib/search", params={"q": "thunder"}).json()["results"]:
            break
        __import__("time").sleep(0.1)
    assert audio.get("/soundlib/search", params={"q": "thunder"}).json()["results"] == []
    assert audio.get("/soundlib/preview/local:storm.mp3").status_code == 404


def test_missing_folder_is_unavailable_not_empty(start_service, tmp_path):
    audio = start_audio(start_service, tmp_path, env={"SOUNDLIB_DIR": str(tmp_path / "nowhere")})
    caps = audio.get("/capabilities").json()
    assert caps["soundlib"] == {
        "available": False,
        "provider": "local",
        "reason": f"the sound folder {tmp_path / 'nowhere'} does not exist",
    }
    search = audio.get("/soundlib/search", params={"q": "bell"})
    assert search.status_code == 503 and "does not exist" in search.json()["error"]
    assert audio.get("/ready").status_code == 200  # readiness is about speech only


def test_a_preview_over_the_response_cap_is_refused(start_service, tmp_path):
    audio = start_audio(start_service, tmp_path, env={"AUDIO_MAX_RESPONSE_BYTES": "4096"})
    response = audio.get("/soundlib/preview/local:rain.mp3")  # 32 kB
    assert response.status_code == 502 and "larger than the limit of 4096 bytes" in response.json()["error"]
    speech = audio.speech({"text": "This sentence makes more than four kilobytes of audio.", "voiceId": "en-us"})
    assert speech.status_code == 502 and "larger than the limit" in speech.json()["error"]
