"""AI generation through the service in process and a local OpenAI-compatible provider:
statuses, the rows in llm_logs and llm_timings, the stored WebP. The live relays, on a
running gunicorn: tests/wizard/test_ai.py."""

import json
import uuid

import pytest
import requests

from tests.support.wizard import AI_KEY as KEY
from tests.support.wizard import WizardClient, text_call


@pytest.fixture
def root(ai_server):
    return WizardClient(ai_server.base_url, "root", "admins")


def logs(root):
    return root.get("/api/collections/llm_logs").json()


def timings(root):
    return root.get("/api/admin/llm-timings").json()


def test_check_5_json_smoke_call_returns_json_and_is_logged(alice, root):
    response = text_call(alice)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert isinstance(json.loads(answer["content"]), dict)
    timing = answer["timing"]
    assert timing["requestedModel"] == "host default"
    assert timing["resolvedModel"] == "fake-valid-json-resolved"
    assert timing["attempts"] == 1 and timing["totalMs"] >= timing["attemptMs"] >= 0
    assert set(timing) == {"requestedModel", "resolvedModel", "queueMs", "attemptMs", "repairMs", "totalMs", "attempts"}
    latest = logs(root)[0]
    assert latest["kind"] == "smoke" and latest["template_key"] == "smoke.v1"
    assert latest["system"] == "Answer in JSON." and latest["content"] == answer["content"]
    assert json.loads(latest["messages"]) == [{"role": "user", "content": "Say hello."}]
    assert latest["timing"] == timing and latest["user_id"] == "alice"
    row = timings(root)[0]
    assert (row["requested_model"], row["resolved_model"], row["outcome"]) == (
        "host default",
        "fake-valid-json-resolved",
        "ok",
    )


def test_plain_text_success_has_no_timing_and_no_timing_row(alice, root):
    before = len(timings(root))
    response = text_call(alice, "fake-text", json_mode=False, kind="chat")
    assert response.status_code == 200
    assert response.json() == {"content": "Hello from the fake provider.", "timing": None}
    assert logs(root)[0]["kind"] == "chat"
    assert len(timings(root)) == before


def test_repairable_output_is_repaired_locally(alice, fake_ai):
    response = text_call(alice, "fake-repairable")
    assert response.status_code == 200
    assert isinstance(json.loads(response.json()["content"]), dict)
    assert response.json()["timing"]["attempts"] == 1 and fake_ai.count("fake-repairable") == 1
    assert response.json()["timing"]["requestedModel"] == "fake-repairable"


def test_invalid_output_is_generated_once_more(alice, fake_ai):
    response = text_call(alice, "fake-invalid-once")
    assert response.status_code == 200
    assert response.json()["timing"]["attempts"] == 2 and fake_ai.count("fake-invalid-once") == 2


@pytest.mark.parametrize("model", ["fake-invalid-twice", "fake-prose-brackets"])
def test_check_4_output_that_stays_invalid_is_502_with_nothing_fabricated(alice, root, fake_ai, model):
    logged = len(logs(root))
    response = text_call(alice, model, kind="project")
    assert response.status_code == 502, response.text
    assert set(response.json()) == {"error"}
    assert fake_ai.count(model) == 2
    assert len(logs(root)) == logged
    failed = timings(root)[0]
    assert (failed["outcome"], failed["kind"], failed["attempts"]) == ("failed", "project", 2)


@pytest.mark.parametrize("size, status", [(4, 502), (5, 200), (6, 200), (7, 502)])
def test_ideas_batches_hold_five_or_six(alice, size, status):
    response = text_call(alice, f"fake-ideas-{size}", kind="ideas")
    assert response.status_code == status
    if status == 200:
        ideas = json.loads(response.json()["content"])["ideas"]
        assert len(ideas) == size and all(idea["title"] and idea["description"] for idea in ideas)


def test_a_provider_that_names_no_model_resolves_to_unknown(alice):
    assert text_call(alice, "fake-no-model").json()["timing"]["resolvedModel"] == "unknown"


def test_a_slow_provider_is_504_and_timed(alice, root):
    response = text_call(alice, "fake-slow", kind="slow")
    assert response.status_code == 504
    failed = timings(root)[0]
    assert (failed["outcome"], failed["kind"]) == ("failed", "slow")


def test_a_failing_provider_is_502_and_never_shows_the_key(alice):
    response = text_call(alice, "fake-error-500")
    assert response.status_code == 502 and KEY not in response.text


def test_check_6_image_smoke_call_stores_a_webp(alice, root, ai_server):
    timed = len(timings(root))
    response = alice.post("/api/ai/image", json={"subject": "a lighthouse", "aspectRatio": "1:1", "kind": "smoke"})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["provider"] == "fake-openai" and answer["model"] == "fake-png"
    name = answer["url"].removeprefix("/uploads/")
    assert answer["url"].startswith("/uploads/") and name.endswith(".webp")
    uuid.UUID(name.removesuffix(".webp"))
    stored = (ai_server.data_dir / "uploads" / name).read_bytes()
    assert len(stored) > 0 and stored[:4] == b"RIFF" and stored[8:12] == b"WEBP"
    assert alice.get(answer["url"]).content == stored
    latest = logs(root)[0]
    assert (latest["context"], latest["url"], latest["provider"], latest["model"], latest["aspect_ratio"]) == (
        "a lighthouse",
        answer["url"],
        "fake-openai",
        "fake-png",
        "1:1",
    )
    assert len(timings(root)) == timed


def test_an_answer_without_an_image_is_502_and_stores_nothing(alice, ai_server):
    before = set((ai_server.data_dir / "uploads").glob("*"))
    response = alice.post("/api/ai/image", json={"subject": "x", "aspectRatio": "16:9", "model": "fake-no-image"})
    assert response.status_code == 502
    assert set((ai_server.data_dir / "uploads").glob("*")) == before


@pytest.mark.parametrize(
    "body",
    [
        {"subject": "", "aspectRatio": "1:1"},
        {"subject": "   ", "aspectRatio": "1:1"},
        {"subject": "x" * 2001, "aspectRatio": "1:1"},
        {"subject": "x", "aspectRatio": "2:1"},
        {"subject": "x"},
        {"aspectRatio": "1:1"},
        {"subject": 5, "aspectRatio": "1:1"},
    ],
)
def test_bad_image_requests_are_400(alice, body):
    assert alice.post("/api/ai/image", json=body).status_code == 400


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": 1}]},
        {"messages": [{"role": "user", "content": "x"}], "json": "yes"},
        {"messages": [{"role": "user", "content": "x"}], "kind": 3},
        {"messages": [{"role": "user", "content": "x"}], "thoughtsTab": "../x"},
    ],
)
def test_bad_text_requests_are_400(alice, body, fake_ai):
    response = alice.post("/api/ai/text", json=body)
    assert response.status_code == 400, body
    assert sum(fake_ai.calls.values()) == 0


def test_timings_are_for_administrators(alice):
    assert alice.get("/api/admin/llm-timings").status_code == 403
    assert WizardClient(alice.base_url, "public").get("/api/admin/llm-timings").status_code == 403


def test_the_thoughts_route_checks_the_tab(alice):
    assert alice.get("/api/ai/thoughts/short").status_code == 400
    assert requests.get(alice.base_url + f"/api/ai/thoughts/{uuid.uuid4().hex}", timeout=10).status_code == 401
