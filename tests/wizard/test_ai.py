"""AI generation's live relays through a running gunicorn and a local OpenAI-compatible
provider: thoughts and phases reach the right identity and tab; and a wizard with no
provider. Statuses, rows and the stored WebP, in process: tests/unit/wizard/test_ai.py."""

import threading
import uuid

from app.common.sse_client import iter_records
from tests.support.wizard import TEST_IDENTITY, WizardClient, text_call


def test_without_a_provider_generation_says_it_is_unavailable(start_service):
    client = WizardClient(start_service("wizard", env=TEST_IDENTITY).base_url, "alice")
    response = text_call(client)
    assert response.status_code == 503 and "WIZ_AI_BASE_URL" in response.json()["error"]
    response = client.post("/api/ai/image", json={"subject": "x", "aspectRatio": "1:1"})
    assert response.status_code == 503


def _collect(client, path, into, ready, count):
    with client.http.get(client.base_url + path, headers=client.headers(), stream=True, timeout=10) as stream:
        ready.set()
        for record in iter_records(stream):
            into.append(record.json())
            if len(into) >= count:
                return


def test_thoughts_reach_only_the_same_identity_and_tab(alice):
    tab, other_tab = uuid.uuid4().hex, uuid.uuid4().hex
    mine, wrong_tab, wrong_user = [], [], []
    listeners = []
    for client, path, into in [
        (alice, f"/api/ai/thoughts/{tab}", mine),
        (alice, f"/api/ai/thoughts/{other_tab}", wrong_tab),
        (alice.as_user("bob"), f"/api/ai/thoughts/{tab}", wrong_user),
    ]:
        ready = threading.Event()
        thread = threading.Thread(target=_collect, args=(client, path, into, ready, 10_000), daemon=True)
        thread.start()
        assert ready.wait(10)
        listeners.append(thread)
    response = text_call(alice, "fake-text", json_mode=False, thoughtsTab=tab, requestId="r1")
    assert response.status_code == 200
    # bob's own call on the same tab id: the first thing his stream hears is his own.
    text_call(alice.as_user("bob"), "fake-text", json_mode=False, thoughtsTab=tab, requestId="bob-1")
    deadline_text = response.json()["content"]
    for _ in range(100):
        if "".join(m.get("text", "") for m in mine) == deadline_text and wrong_user:
            break
        threading.Event().wait(0.05)  # polling the listener threads' lists, with a bound
    assert "".join(m.get("text", "") for m in mine) == deadline_text
    assert all(m["requestId"] == "r1" for m in mine)
    assert wrong_tab == []
    assert wrong_user and all(m["requestId"] == "bob-1" for m in wrong_user)


def test_phases_are_relayed_to_the_identity(alice):
    seen, ready = [], threading.Event()
    thread = threading.Thread(target=_collect, args=(alice, "/api/ai/phases", seen, ready, 3), daemon=True)
    thread.start()
    assert ready.wait(10)
    text_call(alice, requestId="phase-1")
    thread.join(10)
    assert [(m["requestId"], m["phase"]) for m in seen] == [
        ("phase-1", "queued"),
        ("phase-1", "started"),
        ("phase-1", "done"),
    ]
