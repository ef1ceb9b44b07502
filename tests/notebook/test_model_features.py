"""Chat, transformations, insights, ask and podcasts against the running service
and job worker, the fake providers answering: the model, messages, overrides and
keys our code sent, what it did with the answers, and how it fails."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.common.sse_client import iter_records
from tests.support.notebook import LLM_TIMEOUT, PROVIDER_HOST, credential, model

KEYS = {"openai": "sk-good", "anthropic": "ant-good", "ollama": None}
NAMES = {"openai": "fake-chat", "anthropic": "claude-fake-1", "ollama": "llama-fake:latest"}


@pytest.fixture(scope="module")
def models(llm_nb):
    """One language model per provider; openai's is the default chat model."""
    made = {p: model(llm_nb, NAMES[p], p, credential(llm_nb, p, key=KEYS[p])) for p in NAMES}
    assert llm_nb.post("/models/config", json={"default_chat_model": made["openai"]["id"]}).status_code == 200
    return made


@pytest.fixture(scope="module")
def material(llm_nb):
    """A notebook with a processed text source."""
    notebook = llm_nb.notebook()
    source = llm_nb.post(
        "/sources",
        json={
            "type": "text",
            "notebook_id": notebook,
            "title": "Glaciers",
            "content": "Glaciers carve valleys. Moraines mark where glaciers ended.",
        },
    )
    assert source.status_code == 201, source.text
    return notebook, source.json()["id"]


def failing(nb, word):
    cred = credential(nb, "openai", key="sk-good")
    return model(nb, f"gpt-{word}-{time.monotonic_ns()}", "openai", cred)


def chat_bodies(nb):
    return [r["body"] for r in nb.fake.seen if r["path"].endswith(("chat/completions", "api/chat", "v1/messages"))]


@pytest.mark.parametrize("provider", ["openai", "ollama", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_chat_with_each_provider(llm_nb, models, material, provider, stream):
    nb = llm_nb
    notebook, source_id = material
    session = nb.post("/chat/sessions", json={"notebook_id": notebook, "title": "t"}).json()
    nb.fake.reset()
    body = {
        "session_id": session["id"],
        "message": "What carves valleys?",
        "model_override": models[provider]["id"],
        "stream": stream,
    }
    response = nb.post("/chat/execute", json=body, stream=stream)
    assert response.status_code == 200, response.text
    if stream:
        records = [r.json() for r in iter_records(response)]
        assert {r["type"] for r in records[:-1]} == {"delta"} and records[-1]["type"] == "complete"
        reply = records[-1]["reply"]
        assert "".join(r["content"] for r in records[:-1]) == reply
    else:
        reply = response.json()["messages"][-1]["content"]
    assert reply.startswith(f"Reply from {NAMES[provider]} [{source_id}]")
    (sent,) = chat_bodies(nb)
    assert sent["model"] == NAMES[provider] and sent["stream"] is stream
    assert "What carves valleys?" in str(sent["messages"]) and "Moraines mark" in str(sent)
    history = nb.get(f"/chat/sessions/{session['id']}").json()["messages"]
    assert [(m["type"], m["content"]) for m in history] == [("human", "What carves valleys?"), ("ai", reply)]


def test_overrides_win_and_the_session_remembers_its_own(llm_nb, models):
    nb = llm_nb
    session = nb.post("/chat/sessions", json={"model_override": models["anthropic"]["id"]}).json()
    nb.fake.reset()
    nb.post("/chat/execute", json={"session_id": session["id"], "message": "one"})
    nb.post(
        "/chat/execute", json={"session_id": session["id"], "message": "two", "model_override": models["ollama"]["id"]}
    )
    assert [b["model"] for b in chat_bodies(nb)] == ["claude-fake-1", "llama-fake:latest"]
    unknown = nb.post(
        "/chat/execute", json={"session_id": session["id"], "message": "x", "model_override": "model:doesnotexist"}
    )
    assert unknown.status_code == 404 and unknown.json()["field"] == "model_override"


@pytest.mark.parametrize(
    "word,status,says",
    [
        ("malformed", 502, "not JSON"),
        ("429", 503, "rate limiting"),
        ("401", 502, "rejected the API key"),
        ("slow", 504, "did not answer"),
    ],
)
def test_provider_failures_are_clear_and_change_nothing(llm_nb, word, status, says):
    nb = llm_nb
    bad = failing(nb, word)
    session = nb.post("/chat/sessions", json={}).json()
    started = time.monotonic()
    response = nb.post(
        "/chat/execute", json={"session_id": session["id"], "message": "hello", "model_override": bad["id"]}
    )
    took = time.monotonic() - started
    assert response.status_code == status and says in response.json()["detail"], response.text
    assert took < LLM_TIMEOUT + 2.5  # a dripping provider cannot outlast the deadline
    assert nb.get(f"/chat/sessions/{session['id']}").json()["messages"] == []


def test_connection_refused(llm_nb):
    nb = llm_nb
    closed = credential(nb, "openai_compatible", base_url=f"http://{PROVIDER_HOST}:9/v1")
    lost = model(nb, "any", "openai_compatible", closed)
    response = nb.post(
        "/transformations/execute",
        json={"transformation_id": _transformation(nb)["id"], "input_text": "x", "model_id": lost["id"]},
    )
    assert response.status_code == 502 and "could not be reached" in response.json()["detail"]


def _transformation(nb, prompt="Summarize {{ 7*7 }} and {name} literally."):
    response = nb.post(
        "/transformations", json={"name": f"t{time.monotonic_ns()}", "title": "Summary", "prompt": prompt}
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_a_prompt_is_data_never_a_template(llm_nb, models):
    nb = llm_nb
    transformation = _transformation(nb)
    nb.fake.reset()
    done = nb.post(
        "/transformations/execute", json={"transformation_id": transformation["id"], "input_text": "Ice is cold."}
    )
    assert done.status_code == 200, done.text
    assert done.json()["model_id"] == models["openai"]["id"]
    (sent,) = chat_bodies(nb)
    assert sent["messages"] == [
        {"role": "system", "content": "Summarize {{ 7*7 }} and {name} literally."},
        {"role": "user", "content": "Ice is cold."},
    ]


def test_insights_run_as_jobs_also_when_asked_at_creation(llm_nb, models, material):
    nb = llm_nb
    notebook, source_id = material
    transformation = _transformation(nb, "List the key terms.")
    queued = nb.post(
        f"/sources/{source_id}/insights",
        json={"transformation_id": transformation["id"], "model_id": models["anthropic"]["id"]},
    )
    assert queued.status_code == 202, queued.text
    assert nb.wait_command(queued.json()["command_id"])["status"] == "completed"
    (stored,) = nb.get(f"/sources/{source_id}/insights").json()
    assert stored["content"].startswith("Reply from claude-fake-1") and stored["insight_type"] == "Summary"
    added = nb.post(
        "/sources",
        json={
            "type": "text",
            "notebook_id": notebook,
            "content": "Sea ice floats.",
            "transformations": [transformation["id"]],
        },
    )
    assert added.status_code == 201, added.text
    deadline = time.monotonic() + 60
    while not nb.get(f"/sources/{added.json()['id']}/insights").json():
        assert time.monotonic() < deadline, "the insight asked for at creation never came"
        time.sleep(0.1)  # polling the job's result with a deadline
    unknown = nb.post(
        "/sources",
        json={"type": "text", "notebook_id": notebook, "content": "x", "transformations": ["transformation:nosuch"]},
    )
    assert unknown.status_code == 404 and unknown.json()["field"] == "transformations"
    assert nb.delete(f"/insights/{stored['id']}").status_code == 200


def ask(nb, **body):
    response = nb.post("/ask", json=body, stream=True)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return [r.json() for r in iter_records(response)]


def test_ask_streams_strategy_answers_final_and_complete(llm_nb, models, material):
    nb = llm_nb
    notebook, source_id = material
    nb.fake.reset()
    records = ask(
        nb,
        question="Glaciers or volcanoes?",
        notebook_id=notebook,
        answer_model=models["ollama"]["id"],
        final_answer_model=models["anthropic"]["id"],
    )
    kinds = [r["type"] for r in records]
    assert kinds[0] == "strategy" and kinds[-2:] == ["final_answer", "complete"]
    assert [s["term"] for s in records[0]["searches"]] == ["glaciers", "volcanoes"]
    answers = [r for r in records if r["type"] == "answer"]
    assert [a["term"] for a in answers] == ["glaciers"]  # nothing about volcanoes: no answer for it
    assert answers[0]["sources"] == [source_id] and answers[0]["cited"] == [source_id]
    assert records[-2]["cited"] == [source_id]
    assert [b["model"] for b in chat_bodies(nb)] == ["fake-chat", "llama-fake:latest", "claude-fake-1"]


def test_ask_failing_mid_way_ends_with_an_error_record(llm_nb, models, material):
    notebook, _ = material
    records = ask(llm_nb, question="glaciers?", notebook_id=notebook, answer_model=failing(llm_nb, "malformed")["id"])
    assert [r["type"] for r in records] == ["strategy", "error"]
    assert "not JSON" in records[-1]["detail"]


def test_podcast_episode_with_espeak(llm_nb, models, material):
    nb = llm_nb
    notebook, _ = material
    bad = nb.post("/podcasts/generate", json={"notebook_id": notebook, "episode_name": "e", "speakers": 5})
    assert bad.status_code == 400 and bad.json()["field"] == "speakers"
    queued = nb.post("/podcasts/generate", json={"notebook_id": notebook, "episode_name": "Ice", "speakers": 3})
    assert queued.status_code == 202, queued.text
    command = nb.wait_command(queued.json()["command_id"])
    assert command["status"] == "completed", command
    episode = nb.get(f"/podcasts/episodes/{queued.json()['episode_id']}").json()
    assert [t["speaker"] for t in episode["transcript"]] == ["Alex", "Sam", "Robin"]
    audio = nb.get(f"/podcasts/episodes/{episode['id']}/audio")
    assert audio.status_code == 200 and audio.headers["Content-Type"] == "audio/mpeg" and len(audio.content) > 1000
    assert nb.delete(f"/podcasts/episodes/{episode['id']}").status_code == 200
    assert nb.get(f"/podcasts/episodes/{episode['id']}/audio").status_code == 404


def test_a_failed_episode_is_made_again_once_when_two_retries_race(llm_nb, models, material):
    """Its model's key rejected, the episode fails; with the key fixed, of two retries at
    once one starts a job (202) and the other is a 409; the job completes the episode,
    which is then refused a retry, even once its job's row is gone."""
    nb = llm_nb
    notebook, _ = material
    cred = credential(nb, "openai", key="sk-wrong-123456")
    # think-1500: the retried job runs a while, so the second retry meets it unfinished.
    slow = model(nb, f"fake-think-1500-{time.monotonic_ns()}", "openai", cred)
    queued = nb.post(
        "/podcasts/generate", json={"notebook_id": notebook, "episode_name": "Retried", "model_id": slow["id"]}
    )
    assert queued.status_code == 202, queued.text
    assert nb.wait_command(queued.json()["command_id"])["status"] == "failed"
    episode_id = queued.json()["episode_id"]
    assert nb.put(f"/credentials/{cred['id']}", json={"api_key": "sk-good"}).status_code == 200
    start = threading.Barrier(2)

    def retry(_):
        start.wait(timeout=30)
        return nb.post(f"/api/podcasts/episodes/{episode_id}/retry")

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(retry, range(2)))
    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    [started] = [a.json() for a in answers if a.status_code == 202]
    assert nb.wait_command(started["job_id"])["status"] == "completed"
    episode = nb.get(f"/podcasts/episodes/{episode_id}").json()
    assert nb.get(episode["audio_url"]).status_code == 200
    again = nb.post(f"/api/podcasts/episodes/{episode_id}/retry")
    assert again.status_code == 400 and "completed" in again.json()["detail"]
    # Its job's row gone, the episode's own audio still refuses a remake.
    assert len(nb.query("DELETE FROM command WHERE id = ? RETURNING id", (started["job_id"].split(":", 1)[1],))) == 1
    again = nb.post(f"/api/podcasts/episodes/{episode_id}/retry")
    assert again.status_code == 400 and "completed" in again.json()["detail"]
    assert nb.delete(f"/podcasts/episodes/{episode_id}").status_code == 200


def test_podcast_from_open_notebook_profiles_and_content(llm_nb, models, material):
    """Open Notebook's UI: the built-in profiles, then a generate with a profile's name,
    a speaker profile's id and the context it built as `content`, no notebook; the
    episode carries the profiles and the briefing; the profiles are read-only."""
    nb = llm_nb
    episode_profiles = nb.get("/api/episode-profiles").json()
    speaker_profiles = nb.get("/api/speaker-profiles").json()
    assert [p["name"] for p in episode_profiles] == ["short", "medium", "long"]
    assert [len(p["speakers"]) for p in speaker_profiles] == [1, 2, 3, 4]
    short = episode_profiles[0]
    # The generate dialog refuses a profile whose speaker_config does not resolve; the
    # page asks for setup while outline_llm or voice_model is empty.
    assert short["speaker_config"] in {p["id"] for p in speaker_profiles} and short["speaker_config_name"]
    assert short["outline_llm"] == models["openai"]["id"] and speaker_profiles[0]["voice_model"] == "espeak-ng"
    assert [lang["code"] for lang in nb.get("/api/languages").json()] == ["en-US", "en-GB"]
    assert nb.get("/api/speaker-profiles/speaker_profile:9").status_code == 404
    refused = nb.post("/api/episode-profiles", json={"name": "mine"})
    assert refused.status_code == 405 and "read-only" in refused.json()["detail"]
    assert nb.get("/api/episode-profiles").json() == episode_profiles

    for bad, field in (
        ({"episode_profile": "epic", "speaker_profile": short["speaker_config"]}, "episode_profile"),
        ({"episode_profile": "short", "speaker_profile": "speaker_profile:7"}, "speaker_profile"),
        ({"episode_profile": "short", "speaker_profile": 2}, "speaker_profile"),
    ):
        answer = nb.post("/api/podcasts/generate", json={"episode_name": "x", "content": "Ice.", **bad})
        assert answer.status_code == 400 and answer.json()["field"] == field, answer.text
    before = len(nb.get("/api/podcasts/episodes").json())
    assert nb.post("/api/podcasts/generate", json={"episode_name": "x"}).json()["field"] == "notebook_id"
    assert len(nb.get("/api/podcasts/episodes").json()) == before

    nb.fake.seen.clear()
    queued = nb.post(
        "/api/podcasts/generate",
        json={
            "episode_profile": "short",
            "speaker_profile": "speaker_profile:1",
            "episode_name": "Moraines",
            "content": "Moraines mark where glaciers ended.",
            "briefing_suffix": "Keep it for beginners.",
        },
    )
    assert queued.status_code == 202, queued.text
    assert queued.json()["job_id"] == queued.json()["command_id"] and queued.json()["episode_profile"] == "short"
    # Its podcasts page fails on a status it does not know (EpisodeCard's StatusBadge).
    ui_statuses = {"running", "processing", "completed", "failed", "error", "pending", "submitted", "unknown"}
    assert {e["job_status"] for e in nb.get("/api/podcasts/episodes").json()} <= ui_statuses
    assert nb.wait_command(queued.json()["job_id"])["status"] == "completed"
    prompt = chat_bodies(nb)[-1]["messages"]
    assert "Keep it for beginners." in prompt[0]["content"]
    assert prompt[1]["content"] == "Moraines mark where glaciers ended."
    episode = next(e for e in nb.get("/api/podcasts/episodes").json() if e["id"] == queued.json()["episode_id"])
    assert episode["episode_profile"]["name"] == "short" and episode["speaker_profile"]["name"] == "one speaker"
    assert episode["briefing"] == "Keep it for beginners." and episode["notebook_id"] is None
    assert {t["speaker"] for t in episode["transcript"]} == {"Alex"}
    audio = nb.get(episode["audio_url"])
    assert audio.status_code == 200 and audio.headers["Content-Type"] == "audio/mpeg"
    retried = nb.post(f"/api/podcasts/episodes/{episode['id']}/retry")
    assert retried.status_code == 400 and "completed" in retried.json()["detail"]
    assert nb.delete(f"/api/podcasts/episodes/{episode['id']}").status_code == 200  # the stack is shared
