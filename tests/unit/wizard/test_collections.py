"""The seven collections, in process (route logic only): server-owned fields, filters,
scoping of reads, the write rules, and bad input that changes nothing."""

import json
from urllib.parse import quote

import pytest


def rows(client, name, **wanted):
    query = f"?filter={quote(json.dumps(wanted))}" if wanted else ""
    response = client.get(f"/api/collections/{name}{query}")
    assert response.status_code == 200, response.text
    return response.json()


def test_check_1_created_rows_get_server_assigned_id_and_created_at(wizard):
    response = wizard.post(
        "/api/collections/wizards",
        json={"name": "Haiku", "id": "mine", "created_at": "1999-01-01", "user_id": "mallory", "likes_count": 9},
    )
    assert response.status_code == 201
    row = response.json()
    assert row["id"] != "mine" and len(row["id"]) == 32
    assert row["created_at"] != "1999-01-01" and row["created_at"].endswith("Z")
    assert row["user_id"] == "alice" and row["name"] == "Haiku" and "likes_count" not in row
    assert rows(wizard, "wizards", user_id="alice")[0] == row


def test_lists_are_newest_first(wizard):
    made = [wizard.post("/api/collections/saved_prompts", json={"text": f"p{i}"}).json()["id"] for i in range(3)]
    listed = [row["id"] for row in rows(wizard, "saved_prompts")]
    assert listed[:3] == made[::-1]


def test_global_wizards_are_seeded_with_no_owner(wizard):
    seeded = rows(wizard, "wizards", user_id=None)
    assert len(seeded) >= 3
    assert all(row["user_id"] is None and row["steps"] for row in seeded)


def test_check_3_an_unknown_filter_key_is_400(wizard):
    response = wizard.get("/api/collections/wizards?filter=" + quote(json.dumps({"name": "x"})))
    assert response.status_code == 400
    assert "unknown key 'name'" in response.json()["error"]


@pytest.mark.parametrize("raw", ["not json", "[1,2]", '"text"', '{"is_public": "yes"}', '{"user_id": 3}'])
def test_malformed_filters_are_400(wizard, raw):
    response = wizard.get("/api/collections/wizards?filter=" + quote(raw))
    assert response.status_code == 400
    assert response.json()["error"].startswith("filter")


def test_an_unknown_collection_is_400(wizard):
    for method in ("GET", "POST"):
        response = wizard.request(method, "/api/collections/ideas", json={})
        assert response.status_code == 400
        assert "unknown collection" in response.json()["error"]


def test_filters_test_equality_on_typed_fields(wizard):
    wizard.post("/api/collections/wizards", json={"name": "shared", "is_public": True})
    wizard.post("/api/collections/wizards", json={"name": "hidden", "is_public": False})
    public_names = {row["name"] for row in rows(wizard, "wizards", is_public=True, user_id="alice")}
    assert "shared" in public_names and "hidden" not in public_names


def test_private_collections_show_each_caller_only_their_rows(wizard):
    wizard.post("/api/collections/prompt_history", json={"prompt": "alice's"})
    bob = wizard.as_user("bob")
    bob.post("/api/collections/prompt_history", json={"prompt": "bob's"})
    assert {row["user_id"] for row in rows(bob, "prompt_history")} == {"bob"}
    # A filter cannot widen the scope.
    assert rows(bob, "prompt_history", user_id="alice") == []


def test_shared_collections_show_globals_public_rows_and_own(wizard):
    mine = wizard.post("/api/collections/blueprints", json={"title": "private"}).json()
    shared = wizard.post("/api/collections/blueprints", json={"title": "shared", "is_public": True}).json()
    seen_by_bob = {row["id"] for row in rows(wizard.as_user("bob"), "blueprints")}
    assert shared["id"] in seen_by_bob and mine["id"] not in seen_by_bob
    assert {mine["id"], shared["id"]} <= {row["id"] for row in rows(wizard, "blueprints")}


def test_a_list_carries_the_tag_of_its_content_and_answers_304_while_it_holds(wizard):
    bob = wizard.as_user("bob")
    bob.post("/api/collections/blueprints", json={"title": "bob's shared", "is_public": True})
    first = bob.get("/api/collections/blueprints")
    tag = first.headers["ETag"]
    assert first.status_code == 200 and tag.startswith('"') and first.headers["Cache-Control"] == "private, no-cache"
    for held in (tag, "W/" + tag, f'"other", {tag}'):
        same = bob.get("/api/collections/blueprints", headers={"If-None-Match": held})
        assert same.status_code == 304 and same.content == b"" and same.headers["ETag"] == tag
    # Another user's private row changes the collection, not bob's view of it: still 304.
    wizard.post("/api/collections/blueprints", json={"title": "alice's own"})
    assert bob.get("/api/collections/blueprints", headers={"If-None-Match": tag}).status_code == 304
    # A row bob sees: the whole new list, under a new tag.
    wizard.post("/api/collections/blueprints", json={"title": "alice's shared", "is_public": True})
    changed = bob.get("/api/collections/blueprints", headers={"If-None-Match": tag})
    assert changed.status_code == 200 and changed.headers["ETag"] != tag
    assert changed.json()[0]["title"] == "alice's shared"
    # Alice sees her own private row too: her view has another tag.
    assert wizard.get("/api/collections/blueprints").headers["ETag"] != changed.headers["ETag"]


def test_llm_logs_are_for_administrators_only(wizard, admin):
    assert wizard.get("/api/collections/llm_logs").status_code == 403
    assert wizard.post("/api/collections/llm_logs", json={"kind": "x"}).status_code == 403
    assert admin.get("/api/collections/llm_logs").status_code == 200


def test_admin_prompts_are_read_by_all_and_written_by_administrators(wizard, admin):
    assert wizard.post("/api/collections/admin_prompts", json={"key": "k1", "text": "t"}).status_code == 403
    row = admin.post("/api/collections/admin_prompts", json={"key": "ideas.system", "text": "Be brief."}).json()
    assert "user_id" not in row
    assert any(r["id"] == row["id"] for r in rows(wizard, "admin_prompts", key="ideas.system"))
    assert wizard.patch(f"/api/collections/admin_prompts/{row['id']}", json={"text": "x"}).status_code == 403
    assert wizard.delete(f"/api/collections/admin_prompts/{row['id']}").status_code == 403
    assert (
        admin.patch(f"/api/collections/admin_prompts/{row['id']}", json={"text": "Be very brief."}).json()["text"]
        == "Be very brief."
    )


def test_global_wizards_are_writable_by_administrators_only(wizard, admin):
    target = rows(wizard, "wizards", user_id=None)[0]
    response = wizard.patch(f"/api/collections/wizards/{target['id']}", json={"name": "defaced"})
    assert response.status_code == 403
    assert wizard.delete(f"/api/collections/wizards/{target['id']}").status_code == 403
    updated = admin.patch(f"/api/collections/wizards/{target['id']}", json={"description": "Edited."}).json()
    assert updated["description"] == "Edited." and updated["user_id"] is None and updated["name"] == target["name"]


def test_custom_wizards_are_mutable_only_by_their_owner(wizard, admin):
    row = wizard.post("/api/collections/wizards", json={"name": "own", "is_public": True}).json()
    path = f"/api/collections/wizards/{row['id']}"
    assert wizard.as_user("bob").patch(path, json={"name": "bob's now"}).status_code == 403
    assert admin.patch(path, json={"name": "admin's now"}).status_code == 403
    assert admin.delete(path).status_code == 403
    assert rows(wizard, "wizards", user_id="alice")[0]["name"] == "own"


def test_a_row_another_user_cannot_see_is_404_for_them(wizard):
    row = wizard.post("/api/collections/saved_prompts", json={"text": "secret"}).json()
    assert wizard.as_user("bob").patch(f"/api/collections/saved_prompts/{row['id']}", json={}).status_code == 404
    assert wizard.as_user("bob").delete(f"/api/collections/saved_prompts/{row['id']}").status_code == 404


def test_patch_updates_fields_and_keeps_server_owned_ones(wizard):
    row = wizard.post("/api/collections/saved_prompts", json={"text": "a", "tags": ["x"]}).json()
    updated = wizard.patch(
        f"/api/collections/saved_prompts/{row['id']}",
        json={"text": "b", "id": "other", "created_at": "2000", "user_id": "bob"},
    ).json()
    assert updated == {**row, "text": "b"}


def test_delete_answers_204_with_no_body(wizard):
    row = wizard.post("/api/collections/saved_prompts", json={"text": "gone soon"}).json()
    response = wizard.delete(f"/api/collections/saved_prompts/{row['id']}")
    assert response.status_code == 204 and response.content == b""
    assert all(r["id"] != row["id"] for r in rows(wizard, "saved_prompts"))
    assert wizard.delete(f"/api/collections/saved_prompts/{row['id']}").status_code == 404


def test_generic_writes_to_likes_are_forbidden(wizard, admin):
    for client in (wizard, admin):
        assert client.post("/api/collections/likes", json={"blueprint_id": "x"}).status_code == 403
        assert client.patch("/api/collections/likes/anything", json={}).status_code == 403
        assert client.delete("/api/collections/likes/anything").status_code == 403


def test_blueprint_covers_must_be_uploads(wizard):
    response = wizard.post("/api/collections/blueprints", json={"title": "t", "cover_url": "https://evil/x.png"})
    assert response.status_code == 400 and response.json()["field"] == "cover_url"


@pytest.mark.parametrize(
    "body, headers, status",
    [
        ("not json", {"Content-Type": "application/json"}, 400),
        ("[1]", {"Content-Type": "application/json"}, 400),
        ('{"a": 1}', {"Content-Type": "text/plain"}, 415),
        ('{"is_public": "yes"}', {"Content-Type": "application/json"}, 400),
        ('{"key": 5}', {"Content-Type": "application/json"}, 400),
        ('{"big": "' + "x" * 300_000 + '"}', {"Content-Type": "application/json"}, 413),
    ],
)
def test_bad_bodies_are_refused_and_change_nothing(wizard, body, headers, status):
    before = rows(wizard, "saved_prompts")
    response = wizard.post("/api/collections/saved_prompts", data=body, headers=headers)
    assert response.status_code == status
    assert "error" in response.json()
    assert rows(wizard, "saved_prompts") == before


def test_unknown_routes_and_methods_answer_the_error_body(wizard):
    assert wizard.get("/api/nothing").status_code == 404
    response = wizard.request("PUT", "/api/collections/wizards")
    assert response.status_code == 405 and "error" in response.json()
