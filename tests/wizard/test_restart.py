"""Check 8 and the life of the data across restarts of the gunicorn process."""

import requests

from tests.support.wizard import TEST_IDENTITY, WizardClient


def test_check_8_after_a_restart_the_service_answers_with_its_data(start_service, tmp_path):
    data_dir = tmp_path / "wizard"
    first = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    client = WizardClient(first.base_url, "alice")
    saved = client.post("/api/collections/saved_prompts", json={"text": "kept"}).json()
    seeded = client.get("/api/collections/wizards").json()
    took = first.stop()
    assert took < 20

    second = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    client = WizardClient(second.base_url, "alice")
    response = client.get("/api/me")
    assert response.status_code == 200 and response.json()["id"] == "alice"
    assert client.get("/api/collections/saved_prompts").json() == [saved]
    # The global wizards are seeded once, not again at each start.
    assert client.get("/api/collections/wizards").json() == seeded


def test_deleted_global_wizards_stay_deleted_after_a_restart(start_service, tmp_path):
    data_dir = tmp_path / "wizard"
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    admin = WizardClient(service.base_url, "root", "admins")
    doomed = admin.get("/api/collections/wizards").json()[0]
    assert admin.delete(f"/api/collections/wizards/{doomed['id']}").status_code == 204
    service.stop()
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    ids = [row["id"] for row in WizardClient(service.base_url, "root", "admins").get("/api/collections/wizards").json()]
    assert doomed["id"] not in ids


def test_two_workers_starting_together_seed_once(start_service, tmp_path, redis_server):
    service = start_service(
        "wizard", data_dir=tmp_path / "wizard", workers=2, env={**TEST_IDENTITY, "REDIS_URL": redis_server.new_url()}
    )
    names = [row["name"] for row in WizardClient(service.base_url).get("/api/collections/wizards").json()]
    assert len(names) == len(set(names)) == 3


AS_NGINX_WOULD_ASK = {"Remote-User": "public", "X-Wiz-Accel-Lists": "on"}


def read_wizards_anonymously(service):
    answer = requests.get(service.base_url + "/api/collections/wizards", headers=AS_NGINX_WOULD_ASK, timeout=10)
    assert answer.ok, answer.text


def published_then_stopped(start_service, data_dir):
    """A service on `data_dir` that published the anonymous view of `wizards` and was
    stopped; the path of that view's file."""
    published = data_dir / "lists" / "public" / "wizards.json"
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    read_wizards_anonymously(service)
    assert published.is_file()
    service.stop()
    return published


def test_a_published_anonymous_view_is_withdrawn_at_the_next_start(start_service, tmp_path):
    # Nothing written while the service was stopped may be sent stale by nginx: the
    # next start removes the file, and the next anonymous read publishes it again.
    published = published_then_stopped(start_service, tmp_path / "wizard")
    published.write_bytes(b"[]")  # as if the database had changed meanwhile
    service = start_service("wizard", data_dir=tmp_path / "wizard", env=TEST_IDENTITY)
    assert not published.exists()
    read_wizards_anonymously(service)
    assert published.read_bytes() not in (b"", b"[]")


def test_views_published_on_sqlite_are_withdrawn_once_on_postgresql(start_service, tmp_path, postgres_server):
    # The move keeps the DATA_DIR (copy-to-postgres, then DATABASE_URL): nothing would
    # keep the old files current, so nginx must not find them.
    published = published_then_stopped(start_service, tmp_path / "wizard")
    service = start_service(
        "wizard", data_dir=tmp_path / "wizard", env={**TEST_IDENTITY, "DATABASE_URL": postgres_server.new_database()}
    )
    assert not published.exists()
    read_wizards_anonymously(service)
    assert not published.exists()


def test_a_database_restored_to_an_earlier_state_is_published_again(start_service, tmp_path):
    # The restored counters are below what was published: the views start again
    # rather than refusing every build as older.
    data_dir = tmp_path / "wizard"
    lists = "/api/collections/blueprints"
    published = data_dir / "lists" / "public" / "blueprints.json"
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    assert requests.get(service.base_url + lists, headers=AS_NGINX_WOULD_ASK, timeout=10).ok
    for title in ("one", "two", "three"):
        assert (
            requests.post(
                service.base_url + lists,
                json={"title": title, "is_public": True},
                headers={"Remote-User": "public"},
                timeout=10,
            ).status_code
            == 201
        )
    assert b'"three"' in published.read_bytes()
    service.stop()
    for database in data_dir.glob("wizard.db*"):  # restored to before those writes
        database.unlink()
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    answer = requests.get(service.base_url + lists, headers=AS_NGINX_WOULD_ASK, timeout=10)
    assert answer.ok
    assert published.is_file() and b'"three"' not in published.read_bytes()
