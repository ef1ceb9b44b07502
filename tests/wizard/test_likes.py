"""Likes across two worker processes on Redis: each toggle counted once, the count equal to the rows.
The route logic of likes is tests/unit/wizard/test_likes.py."""

import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

from tests.support.wizard import WizardClient


def like_rows(admin, blueprint_id):
    response = admin.get("/api/collections/likes?filter=" + quote(json.dumps({"blueprint_id": blueprint_id})))
    return response.json()


def blueprint(client, blueprint_id):
    return next(row for row in client.get("/api/collections/blueprints").json() if row["id"] == blueprint_id)


def test_concurrent_toggles_keep_the_count_equal_to_the_rows(start_service, tmp_path, redis_server):
    # Two worker processes, so toggles also race across processes on the database.
    service = start_service(
        "wizard", workers=2, env={"WIZ_ALLOW_TEST_IDENTITY": "1", "REDIS_URL": redis_server.new_url()}
    )
    owner = WizardClient(service.base_url, "owner")
    admin = WizardClient(service.base_url, "root", "admins")
    target = owner.post("/api/collections/blueprints", json={"title": "hot", "is_public": True}).json()["id"]

    def toggle(user):
        return WizardClient(service.base_url, user).post("/api/likes/toggle", json={"blueprint_id": target})

    with ThreadPoolExecutor(50) as pool:
        different = list(pool.map(toggle, [f"user{i}" for i in range(50)]))
    assert all(r.status_code == 200 for r in different)
    assert sorted(r.json()["likes_count"] for r in different) == list(range(1, 51))
    assert len(like_rows(admin, target)) == 50 == blueprint(owner, target)["likes_count"]

    with ThreadPoolExecutor(50) as pool:
        same = list(pool.map(toggle, ["user0"] * 50))  # an even number: ends as it began
    assert all(r.status_code == 200 for r in same)
    assert [r.json()["liked"] for r in same].count(True) == 25
    assert len(like_rows(admin, target)) == 50 == blueprint(owner, target)["likes_count"]
