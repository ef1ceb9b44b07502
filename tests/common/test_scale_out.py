"""Four workers on PostgreSQL and Redis, as a scaled-out deployment runs: what
several processes writing at once must not break."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from devtools.database_peek import peek
from tests.support.wizard import TEST_IDENTITY, WizardClient
from tests.support.workspace import MESH_ENV, OWNER, Workspace

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4


@pytest.fixture
def scaled_out(start_service, postgres_server, redis_server):
    """start(name, env=None) -> a service with 4 workers on a new database and Redis."""

    def start(name, env=None):
        return start_service(
            name,
            workers=WORKERS,
            env={
                "DATABASE_URL": postgres_server.new_database(),
                "REDIS_URL": redis_server.new_url(),
                **MESH_ENV,
                **(env or {}),
            },
        )

    return start


def test_wizard_like_toggles_from_four_workers_keep_the_count_equal_to_the_rows(scaled_out):
    service = scaled_out("wizard", TEST_IDENTITY)
    assert len(service.worker_pids()) == WORKERS
    owner = WizardClient(service.base_url, "owner")
    target = owner.post("/api/collections/blueprints", json={"title": "hot", "is_public": True}).json()["id"]

    def toggle(user):
        # A connection of its own per toggle, so that they spread over the workers.
        return requests.post(
            service.base_url + "/api/likes/toggle",
            json={"blueprint_id": target},
            headers={"X-Wiz-Test-User": user, "X-Wiz-Test-Groups": ""},
            timeout=60,
        )

    def likes_in_database():
        with peek(service) as db:
            rows = db.execute("SELECT count(*) FROM likes WHERE blueprint_id = ?", (target,)).fetchone()[0]
            count = db.execute("SELECT likes_count FROM blueprints WHERE id = ?", (target,)).fetchone()[0]
        return rows, count

    with ThreadPoolExecutor(50) as pool:
        different = list(pool.map(toggle, [f"user{i}" for i in range(50)]))
    assert [r.status_code for r in different] == [200] * 50
    assert sorted(r.json()["likes_count"] for r in different) == list(range(1, 51))
    assert likes_in_database() == (50, 50)

    with ThreadPoolExecutor(50) as pool:
        same = list(pool.map(toggle, ["user0"] * 50))  # an even number: ends as it began
    assert [r.status_code for r in same] == [200] * 50
    assert [r.json()["liked"] for r in same].count(True) == 25
    assert likes_in_database() == (50, 50)


def test_wizard_globals_are_seeded_once_by_four_workers_starting_together(scaled_out):
    service = scaled_out("wizard", TEST_IDENTITY)
    seeded = json.loads((ROOT / "app" / "wizard" / "seed" / "wizards.json").read_text(encoding="utf-8"))
    listed = WizardClient(service.base_url, "someone").get("/api/collections/wizards").json()
    assert len(listed) == len(seeded)
    with peek(service) as db:
        assert db.execute("SELECT count(*) FROM wizards WHERE user_id IS NULL").fetchone()[0] == len(seeded)


def test_workspace_first_user_race_over_four_workers_makes_one_owner(scaled_out):
    ws = Workspace(scaled_out("workspace"))

    def first(n):
        return requests.post(
            ws.api + "/users/first",
            json={**OWNER, "username": f"owner{n}", "email": f"owner{n}@example.com"},
            timeout=60,
        )

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(first, range(20)))
    assert sorted(r.status_code for r in answers) == [201] + [409] * 19
    assert ws.count("user") == 1
    with ws.db() as db:
        assert db.execute('SELECT roles FROM "user"').fetchone()[0] == '["owner"]'
