"""The prompt wizard's acceptance checks (spec 002), through its public address as
an anonymous visitor: nginx makes every visitor without a session `public`.
Checks 7, 9 and 10 are the browser's (tests/browser); check 8's restart half is
proven where a test can restart the service (tests/wizard, the staging box)."""

import json
import re
from urllib.parse import quote


def test_identity_answers_for_anonymous_visitors(wizard):
    response = wizard.get("/api/me")
    assert response.status_code == 200
    assert response.json() == {"id": "public", "username": "public", "is_admin": False}


def test_identity_headers_from_the_client_are_not_believed(wizard):
    forged = {
        "Remote-User": "root",
        "Remote-Groups": "admins",
        "X-Wiz-Test-User": "root",
        "X-Wiz-Test-Groups": "admins",
    }
    assert wizard.get("/api/me", headers=forged).json()["is_admin"] is False
    assert wizard.get("/api/collections/llm_logs", headers=forged).status_code == 403


def test_check_1_created_wizard_has_server_assigned_id_and_created_at(wizard):
    response = wizard.post(
        "/api/collections/wizards", json={"name": "acceptance", "id": "client-id", "created_at": "2000-01-01T00:00:00Z"}
    )
    assert response.status_code == 201
    row = response.json()
    assert row["id"] != "client-id" and row["created_at"] != "2000-01-01T00:00:00Z"
    assert row["user_id"] == "public"
    assert wizard.delete(f"/api/collections/wizards/{row['id']}").status_code == 204


def test_check_2_like_toggle_twice_leaves_no_orphan(wizard):
    blueprint = wizard.post("/api/collections/blueprints", json={"title": "acceptance"}).json()
    try:
        first = wizard.post("/api/likes/toggle", json={"blueprint_id": blueprint["id"]})
        assert first.json() == {"liked": True, "likes_count": 1}
        second = wizard.post("/api/likes/toggle", json={"blueprint_id": blueprint["id"]})
        assert second.json() == {"liked": False, "likes_count": 0}
        mine = wizard.get("/api/collections/likes?filter=" + quote(json.dumps({"blueprint_id": blueprint["id"]})))
        assert mine.json() == []
    finally:
        wizard.delete(f"/api/collections/blueprints/{blueprint['id']}")


def test_check_3_unknown_filter_key_is_400(wizard):
    response = wizard.get("/api/collections/wizards?filter=" + quote(json.dumps({"title": "x"})))
    assert response.status_code == 400 and "error" in response.json()


def test_check_5_json_smoke_call(wizard):
    # A target with no AI provider configured answers 503 here: checks 5 and 6 need one.
    response = wizard.post(
        "/api/ai/text",
        json={
            "messages": [{"role": "user", "content": "Reply with a JSON object."}],
            "json": True,
            "kind": "smoke",
            "templateKey": "acceptance",
        },
    )
    assert response.status_code == 200, response.text
    assert isinstance(json.loads(response.json()["content"]), (dict, list))
    assert response.json()["timing"]["requestedModel"] == "host default"


def test_check_6_image_smoke_call(wizard):
    response = wizard.post("/api/ai/image", json={"subject": "a small red boat", "aspectRatio": "1:1", "kind": "smoke"})
    assert response.status_code == 200, response.text
    url = response.json()["url"]
    assert re.fullmatch(r"/uploads/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.webp", url)
    image = wizard.get(url)
    assert image.status_code == 200 and image.content[:4] == b"RIFF" and image.content[8:12] == b"WEBP"
    assert image.headers["X-Content-Type-Options"] == "nosniff"


def test_events_stream_is_served_unbuffered(wizard):
    with wizard.get("/api/events", stream=True) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Accel-Buffering"] == "no"
