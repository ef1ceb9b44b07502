"""Fixtures shared by every test: services started exactly as production starts
them (gunicorn, gevent worker, real files), and the Flask app for unit tests.

Each test's tier follows from its folder (`pytest_collection_modifyitems` below), so
no module names its own:
- tests/unit/<area>/: `unit`, needs no process besides pytest's own (pure functions,
  apps in process through tests.support.inprocess or Flask's test client); the
  modules there are `in_process` as well. `make check` runs these.
- tests/ops, tests/acceptance, tests/browser: `system` (staging containers, Chromium).
- every other folder: `service` (real gunicorn, nginx, PostgreSQL, Redis, subprocesses).
A unit-tier test that a parameter puts on PostgreSQL (`db_backend`) needs its server,
so it is a `service` test where it stands. `make test` runs every tier.
"""

from pathlib import Path

import pytest
import requests

from app import create_app
from tests.support.acceptance import ACCEPTANCE_SERVICES
from tests.support.decks import copy_sample_deck, decks_with_sample
from tests.support.inprocess import InProcessStarter
from tests.support.shared import DatabaseBackend, ServiceStarter
from tests.support.wizard import FORWARD_AUTH_PASSWORD
from tests.support.workspace import AgentProcess
from tests.support.workspace_app import LocalApp

TESTS = Path(__file__).resolve().parent
SYSTEM_FOLDERS = {"ops", "acceptance", "browser"}
# Parameters (fixture -> values) under which a test needs a server of its own.
NEEDS_A_SERVER = {"db_backend": {"postgresql"}}
# Fixtures that start processes: a test that uses one has no place in tests/unit.
STARTS_PROCESSES = {"start_service", "postgres_server", "redis_server", "start_agent", "nginx_for"}


def tier_of(item):
    """`unit`, `service` or `system`, from the test's folder below tests/ (and, for the
    unit folder, from the parameters that put it on a server)."""
    path = Path(item.path).resolve()
    folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
    if folder in SYSTEM_FOLDERS:
        return "system"
    if folder != "unit":
        return "service"
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(params.get(name) in values for name, values in NEEDS_A_SERVER.items()):
        return "service"
    return "unit"


def pytest_collection_modifyitems(items):
    for item in items:
        tier = tier_of(item)
        starts = STARTS_PROCESSES.intersection(getattr(item, "fixturenames", ()))
        if tier == "unit" and starts:
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(starts))}: a test that starts "
                "processes belongs in tests/<area>/, not in tests/unit/"
            )
        item.add_marker(tier)
        module = item.getparent(pytest.Module)
        in_unit = module is not None and Path(module.path).resolve().is_relative_to(TESTS / "unit")
        if in_unit and not module.get_closest_marker("in_process"):
            module.add_marker("in_process")


@pytest.fixture
def start_service(tmp_path_factory):
    starter = ServiceStarter(tmp_path_factory)
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def start_module_service(request, tmp_path_factory):
    """Like start_service, for services shared by the tests of a module that
    leave no trace (read-only requests, rejected inputs). In a module marked
    `in_process` (every module of tests/unit), the services are apps in the test's
    own process (tests.support.inprocess) instead of gunicorn servers."""
    in_process = request.node.get_closest_marker("in_process") is not None
    starter = (InProcessStarter if in_process else ServiceStarter)(tmp_path_factory)
    yield starter
    starter.stop_all()


@pytest.fixture
def decks_server(start_service, tmp_path):
    """A running deck review service whose DATA_DIR holds the sample deck's sources
    (not yet imported): `decks_server.import_body` imports it."""
    return decks_with_sample(start_service, tmp_path / "decks-data")


@pytest.fixture(scope="module")
def shared_decks_server(start_module_service, tmp_path_factory):
    """One deck service per test module with the sample deck imported and one
    session (`.session`), for tests that change nothing."""
    service = decks_with_sample(start_module_service, tmp_path_factory.mktemp("shared") / "decks-data")
    requests.post(f"{service.base_url}/api/decks/import", json=service.import_body, timeout=10).raise_for_status()
    created = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10)
    created.raise_for_status()
    service.session = created.json()
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


def pytest_addoption(parser):
    group = parser.getgroup("acceptance", "targets of tests/acceptance (default: a local stack)")
    for name in ACCEPTANCE_SERVICES:
        group.addoption(
            f"--{name}-url",
            default=None,
            help=f"public base URL of the {name} service, e.g. https://{name}.example.org",
        )
        group.addoption(
            f"--{name}-host", default=None, help=f"Host header to send to --{name}-url (when the URL is an address)"
        )
    group.addoption("--insecure", action="store_true", help="do not verify TLS certificates (staging)")
    group.addoption(
        "--ca-file",
        default=None,
        help="verify TLS certificates against this CA file instead of the system's (a private ACME server)",
    )


@pytest.fixture(scope="module")
def forward_auth_provider():
    """The Authelia-shaped provider with three portal users for the wizard's forward
    auth: ada (group wiz-admins), bo and Public (no groups: a name that differs from the
    anonymous `public` by its case only), all with FORWARD_AUTH_PASSWORD; its one client
    is not used by these tests."""
    from devtools.oidc_provider import OidcProvider, pbkdf2_sha512_digest

    config = {
        "clients": [
            {
                "client_id": "workspace",
                "client_secret_digest": pbkdf2_sha512_digest("s", rounds=1000),
                "redirect_uris": ["https://workspace.example/api/v2/users/oidc/callback"],
            }
        ],
        "users": [
            {"username": name, "password": FORWARD_AUTH_PASSWORD, "email": f"{name}@example.com", "groups": groups}
            for name, groups in (("ada", ["wiz-admins"]), ("bo", []), ("Public", []))
        ],
    }
    with OidcProvider(config) as provider:
        yield provider


# --------------------------------------------------------------------------- database backends


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the session (initdb + pg_ctl in a temporary folder);
    `.new_database()` gives each service a database of its own."""
    from devtools.pg_server import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_server():
    """One Redis server for the session; `.new_url()` gives a test a database of its own."""
    from devtools.redis_server import RedisServer

    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_backend(request):
    """Each database-backed service's API tests run on both backends: the embedded
    SQLite file and a PostgreSQL server."""
    postgres = request.getfixturevalue("postgres_server") if request.param == "postgresql" else None
    return DatabaseBackend(request.param, postgres)


# ------------------------------------------- workspace agents (workspace and proxy tests)


@pytest.fixture
def start_agent(tmp_path):
    """start_agent(url, token, apps=()) -> AgentProcess; all stopped at teardown."""
    started = []

    def start(url, token, apps=(), extra=()):
        agent = AgentProcess(tmp_path, url, token, apps, extra)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture(scope="module")
def local_app():
    """A real HTTP app (tests.support.workspace_app) to put behind an agent."""
    app = LocalApp()
    yield app
    app.stop()
