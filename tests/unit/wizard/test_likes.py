"""Likes: the toggle is the only way to change them, and the count always equals
the like rows, whatever the concurrency."""

import json
from urllib.parse import quote

import pytest


def like_rows(admin, blueprint_id):
    response = admin.get("/api/collections/likes?filter=" + quote(json.dumps({"blueprint_id": blueprint_id})))
    return response.json()


def blueprint(client, blueprint_id):
    return next(row for row in client.get("/api/collections/blueprints").json() if row["id"] == blueprint_id)


@pytest.fixture
def shared_blueprint(wizard):
    return wizard.post("/api/collections/blueprints", json={"title": "shared", "is_public": True}).json()


def test_check_2_like_then_unlike_leaves_no_orphan(wizard, admin, shared_blueprint):
    bob = wizard.as_user("bob")
    first = bob.post("/api/likes/toggle", json={"blueprint_id": shared_blueprint["id"]})
    assert first.status_code == 200 and first.json() == {"liked": True, "likes_count": 1}
    assert blueprint(bob, shared_blueprint["id"])["likes_count"] == 1
    assert [row["user_id"] for row in like_rows(admin, shared_blueprint["id"])] == ["bob"]
    second = bob.post("/api/likes/toggle", json={"blueprint_id": shared_blueprint["id"]})
    assert second.json() == {"liked": False, "likes_count": 0}
    assert like_rows(admin, shared_blueprint["id"]) == []
    assert blueprint(bob, shared_blueprint["id"])["likes_count"] == 0


def test_each_caller_reads_their_own_likes(wizard, shared_blueprint):
    wizard.post("/api/likes/toggle", json={"blueprint_id": shared_blueprint["id"]})
    assert wizard.as_user("carol").get("/api/collections/likes").json() == []
    mine = wizard.get("/api/collections/likes").json()
    assert [row["blueprint_id"] for row in mine] == [shared_blueprint["id"]]


def test_an_unknown_or_invisible_blueprint_is_404(wizard):
    assert wizard.post("/api/likes/toggle", json={"blueprint_id": "nope"}).status_code == 404
    hidden = wizard.post("/api/collections/blueprints", json={"title": "mine only"}).json()
    assert wizard.as_user("bob").post("/api/likes/toggle", json={"blueprint_id": hidden["id"]}).status_code == 404


@pytest.mark.parametrize("body", [{}, {"blueprint_id": 5}, {"blueprint_id": ""}, {"blueprint_id": None}])
def test_a_bad_toggle_body_is_400(wizard, body):
    assert wizard.post("/api/likes/toggle", json=body).status_code == 400


def test_deleting_a_blueprint_removes_its_likes(wizard, admin, shared_blueprint):
    wizard.as_user("dan").post("/api/likes/toggle", json={"blueprint_id": shared_blueprint["id"]})
    assert wizard.delete(f"/api/collections/blueprints/{shared_blueprint['id']}").status_code == 204
    assert like_rows(admin, shared_blueprint["id"]) == []
