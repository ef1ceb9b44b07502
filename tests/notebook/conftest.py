"""Fixtures of the notebook's tests: the service under gunicorn (as production
starts it) AND its job worker (`python -m app.notebook worker`) on one DATA_DIR,
shared by the whole notebook suite (tests scope their data by notebook), plus a
local HTTP server on 127.0.0.2 that serves the links.

`nb` and `llm_nb` follow `db_backend` (tests/conftest.py): every module that uses
them runs once on the embedded default (SQLite, huey's SQLite queue) and once scaled
out (PostgreSQL, and the job queue on Redis). Each backend's stack is started once,
at its first use, and shared by the modules after."""

import http.server
import threading

import pytest

from tests.support.notebook import (
    LINK_HOST,
    LLM_TIMEOUT,
    PROVIDER_HOST,
    LinkHandler,
    llm_stack,
    scaled_out_env,
    shared_stack,
    stop_stack,
)

# --------------------------------------------------------------------------- the link server


@pytest.fixture(scope="session")
def link_server():
    server = http.server.ThreadingHTTPServer((LINK_HOST, 0), LinkHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.base_url = f"http://{LINK_HOST}:{server.server_address[1]}"
    server.state = LinkHandler.state
    server.gate = LinkHandler.gate
    yield server
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------- service + worker


@pytest.fixture(scope="session")
def nb_sqlite(tmp_path_factory, link_server):
    client = shared_stack(tmp_path_factory, "notebook", "sqlite", link_server)
    yield client
    stop_stack(client)


@pytest.fixture(scope="session")
def nb_postgresql(tmp_path_factory, link_server, postgres_server, redis_server):
    client = shared_stack(
        tmp_path_factory, "notebook", "postgresql", link_server, **scaled_out_env(postgres_server, redis_server)
    )
    yield client
    stop_stack(client)


@pytest.fixture(scope="module")
def nb(db_backend, request):
    """The service + worker of the notebook suite, on the module's backend."""
    return request.getfixturevalue(f"nb_{db_backend.name}")


@pytest.fixture
def notebook_id(nb):
    return nb.notebook()


# --------------------------------------------------------------------------- model providers


@pytest.fixture(scope="session")
def fake_providers():
    from devtools.fake_providers import FakeProviders

    with FakeProviders(
        host=PROVIDER_HOST, keys={"openai": "sk-good", "anthropic": "ant-good"}, drip_seconds=LLM_TIMEOUT * 4
    ) as fake:
        yield fake


@pytest.fixture(scope="session")
def llm_nb_sqlite(tmp_path_factory, fake_providers):
    client = llm_stack(tmp_path_factory, fake_providers, "sqlite")
    yield client
    stop_stack(client)


@pytest.fixture(scope="session")
def llm_nb_postgresql(tmp_path_factory, fake_providers, postgres_server, redis_server):
    client = llm_stack(tmp_path_factory, fake_providers, "postgresql", **scaled_out_env(postgres_server, redis_server))
    yield client
    stop_stack(client)


@pytest.fixture(scope="module")
def llm_nb(db_backend, request):
    """The model features' service + worker, on the module's backend."""
    return request.getfixturevalue(f"llm_nb_{db_backend.name}")
