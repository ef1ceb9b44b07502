"""Fixtures shared by every test: services started exactly as production starts
them (gunicorn, gevent worker, real files), and the Flask app for unit tests."""
import shutil
from pathlib import Path

import pytest
import requests

from app import create_app
from devtools import services

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DECK = ROOT / "samples" / "decks" / "welcome"
STOP_TIMEOUT = 20.0


@pytest.fixture
def start_service(tmp_path_factory):
    """start_service(name, data_dir=None, workers=1, env=None) -> RunningService.

    Every service started is stopped at teardown with SIGTERM, and the test fails
    if it takes 20 s or more to exit (systemd's stop time-out)."""
    started = []

    def start(name, data_dir=None, workers=1, env=None):
        data_dir = data_dir or tmp_path_factory.mktemp(f"{name}-data")
        service = services.start(name, data_dir, workers=workers, env=env)
        started.append(service)
        return service

    yield start
    for service in started:
        took = service.stop(timeout=STOP_TIMEOUT)
        assert took < STOP_TIMEOUT, f"{service.name} took {took:.1f} s to stop"


def copy_sample_deck(data_dir, name="welcome"):
    """The sample deck's sources under DATA_DIR/sources/<name>; returns the import body."""
    target = Path(data_dir) / "sources" / name
    shutil.copytree(SAMPLE_DECK, target)
    return {"id": name, "md_path": f"sources/{name}/deck.md", "copy_from": f"sources/{name}"}


@pytest.fixture
def decks_server(start_service, tmp_path):
    """A running deck review service whose DATA_DIR holds the sample deck's sources
    (not yet imported): `decks_server.import_body` imports it."""
    data_dir = tmp_path / "decks-data"
    data_dir.mkdir()
    body = copy_sample_deck(data_dir)
    service = start_service("decks", data_dir=data_dir)
    service.import_body = body
    return service


@pytest.fixture
def deck_session(decks_server):
    """A running service with the sample deck imported and one session: (service, session)."""
    url = decks_server.base_url
    requests.post(f"{url}/api/decks/import", json=decks_server.import_body, timeout=10).raise_for_status()
    response = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome"}, timeout=10)
    response.raise_for_status()
    return decks_server, response.json()


@pytest.fixture
def decks_app(tmp_path):
    """The deck service's Flask app on a temporary DATA_DIR, for unit tests."""
    data_dir = tmp_path / "decks-data"
    data_dir.mkdir()
    flask_app = create_app("decks", {"DATA_DIR": str(data_dir), "TESTING": True})
    flask_app.sample_import = copy_sample_deck(data_dir)
    return flask_app


@pytest.fixture
def decks_client(decks_app):
    return decks_app.test_client()
