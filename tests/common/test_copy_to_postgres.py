"""Moving an install from its SQLite file to PostgreSQL, as an admin would:
`python -m app.<service> copy-to-postgres <URL>` with the service stopped, then the
service started on DATABASE_URL finds everything (sessions included)."""

import re
import subprocess
import sys
from pathlib import Path

import requests

from tests.support.wizard import TEST_IDENTITY, WizardClient
from tests.support.workspace import OWNER, Workspace

ROOT = Path(__file__).resolve().parents[2]


def copy_command(service, data_dir, url):
    return subprocess.run(
        [sys.executable, "-m", f"app.{service}", "copy-to-postgres", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin"},
    )


def counts(output):
    """{table: (sqlite rows, postgresql rows)} from the command's table."""
    return {name: (int(a), int(b)) for name, a, b in re.findall(r"^(\w+)\s+(\d+)\s+(\d+)", output, re.M)}


def test_the_workspace_moves_with_its_users_and_sessions(start_service, postgres_server, tmp_path):
    data_dir = tmp_path / "workspace"
    before = Workspace(start_service("workspace", data_dir=data_dir))
    token = before.first_user()
    for n in range(3):
        requests.post(
            before.api + "/users",
            json={"email": f"u{n}@example.com", "username": f"u{n}", "password": "a good long passphrase"},
            headers=before.as_user(token),
            timeout=10,
        ).raise_for_status()
    before.service.stop()

    url = postgres_server.new_database()
    done = copy_command("workspace", data_dir, url)
    assert done.returncode == 0, done.stderr
    table = counts(done.stdout)
    assert table["user"] == (4, 4) and all(a == b for a, b in table.values()), done.stdout
    assert table["auditlog"][0] > 0

    after = Workspace(start_service("workspace", data_dir=tmp_path / "unused", env={"DATABASE_URL": url}))
    me = requests.get(after.api + "/users/me", headers=after.as_user(token), timeout=10)
    assert me.status_code == 200 and me.json()["username"] == OWNER["username"]
    assert after.login("u2@example.com", "a good long passphrase").status_code == 201
    # New rows get new ids after the copied ones (the sequences moved on).
    assert (
        requests.post(
            after.api + "/users",
            json={"email": "new@example.com", "username": "new", "password": "a good long passphrase"},
            headers=after.as_user(token),
            timeout=10,
        ).status_code
        == 201
    )

    again = copy_command("workspace", data_dir, url)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_the_wizard_moves_with_its_rows_and_counters(start_service, postgres_server, tmp_path):
    data_dir = tmp_path / "wizard"
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    owner = WizardClient(service.base_url, "owner")
    made = [
        owner.post("/api/collections/blueprints", json={"title": f"b{n}", "is_public": True}).json()["id"]
        for n in range(5)
    ]
    owner.as_user("fan").post("/api/likes/toggle", json={"blueprint_id": made[0]}).raise_for_status()
    listed = owner.get("/api/collections/blueprints").json()
    assert len(listed) == 5
    service.stop()

    url = postgres_server.new_database()
    done = copy_command("wizard", data_dir, url)
    assert done.returncode == 0, done.stderr
    table = counts(done.stdout)
    assert table["blueprints"] == (5, 5) and table["likes"] == (1, 1) and table["wizards"][0] > 0, done.stdout

    moved = start_service("wizard", data_dir=tmp_path / "unused", env={**TEST_IDENTITY, "DATABASE_URL": url})
    client = WizardClient(moved.base_url, "owner")
    assert client.get("/api/collections/blueprints").json() == listed
    # The seeded global wizards came along, and were not seeded a second time.
    assert len(client.get("/api/collections/wizards").json()) == table["wizards"][0]
    newer = client.post("/api/collections/blueprints", json={"title": "after", "is_public": True})
    assert newer.status_code == 201
    assert client.get("/api/collections/blueprints").json()[0]["id"] == newer.json()["id"]


def test_a_target_that_is_not_postgresql_is_refused(tmp_path):
    done = copy_command("wizard", tmp_path, "sqlite:///elsewhere.db")
    assert done.returncode == 2 and "postgresql://" in done.stderr
