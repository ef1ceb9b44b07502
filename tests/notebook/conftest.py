"""Fixtures of the notebook's tests: the service under gunicorn (as production
starts it) AND its job worker (`python -m app.notebook worker`) on one DATA_DIR,
shared by the whole notebook suite (tests scope their data by notebook), plus a
local HTTP server on 127.0.0.2 that serves the links.

`nb` and `llm_nb` follow `db_backend` (tests/conftest.py): every module that uses
them runs once on the embedded default (SQLite, huey's SQLite queue) and once scaled
out (PostgreSQL, and the job queue on Redis). Each backend's stack is started once,
at its first use, and shared by the modules after."""
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from devtools import services
from devtools.database_peek import peek
from tests.notebook import documents

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "test-password-9f3a"
AUTH = {"Authorization": f"Bearer {PASSWORD}"}
LINK_HOST = "127.0.0.2"          # allowed by NOTEBOOK_URL_ALLOWLIST; 127.0.0.1 stays forbidden
MAX_UPLOAD = 2 * 1024 * 1024     # small cap, so that 413 is cheap to reach
JOB_DEADLINE = 120.0             # the worker's first job waits for the model to load


# --------------------------------------------------------------------------- the link server

class LinkHandler(http.server.BaseHTTPRequestHandler):
    # hits: requests per path. gates: name -> threading.Event that /gate/<name> waits on.
    state = {"flaky_ok": False, "hits": {}, "gates": {}}
    lock = threading.Lock()

    @classmethod
    def gate(cls, name):
        """The event that releases the requests for /gate/<name>."""
        with cls.lock:
            return cls.state["gates"].setdefault(name, threading.Event())

    def log_message(self, *args):
        pass

    def _send(self, status, body, content_type, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        with self.lock:
            self.state["hits"][path] = self.state["hits"].get(path, 0) + 1
        if path == "/article.html":
            self._send(200, documents.ARTICLE_HTML.encode(), "text/html; charset=utf-8")
        elif path == "/paper.pdf":
            self._send(200, documents.pdf_bytes(documents.PDF_TEXT), "application/pdf")
        elif path.startswith("/slow"):
            # A job that takes a while, so that the jobs behind it stay queued.
            time.sleep(float(self.path.split("seconds=", 1)[1]) if "seconds=" in self.path else 3.0)
            self._send(200, b"A slow page about glaciers and ice ages.", "text/plain")
        elif path.startswith("/page/"):
            # A page of its own per job: its hit count says how many times the job ran.
            self._send(200, f"Page {path[6:]} is about tides and estuaries.".encode(), "text/plain")
        elif path.startswith("/gate/"):
            # A job that runs until the test releases it (never longer than a minute).
            self.gate(path[6:]).wait(60)
            self._send(200, b"The gate opened onto a meadow of clover.", "text/plain")
        elif path == "/flaky":
            if self.state["flaky_ok"]:
                self._send(200, b"The flaky page finally talks about volcanoes.", "text/plain")
            else:
                self._send(503, b"try later", "text/plain")
        elif path == "/to-internal":
            self._send(302, b"", "text/plain", {"Location": self.headers.get("X-Target", "http://127.0.0.1:1/")})
        elif path == "/image.png":
            self._send(200, b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png")
        else:
            self._send(404, b"no such page", "text/plain")


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

def notebook_env(data_dir, **extra):
    return {"NOTEBOOK_PASSWORD": PASSWORD, "NOTEBOOK_URL_ALLOWLIST": f"{LINK_HOST}/32",
            "NOTEBOOK_MAX_UPLOAD_BYTES": str(MAX_UPLOAD), "DATA_DIR": str(data_dir), **extra}


class Worker:
    """`python -m app.notebook worker` on a DATA_DIR, its log in a file."""

    def __init__(self, data_dir, env, name="worker"):
        self.log_path = Path(data_dir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "app.notebook", "worker"], cwd=ROOT,
                                        env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT)

    def log_text(self):
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout=20.0):
        took = services.terminate(self.process, timeout)
        self.log.close()
        return took


class Client:
    """The running notebook, with the password, and helpers that poll with deadlines."""

    def __init__(self, service, worker):
        self.service, self.worker = service, worker
        self.url = service.base_url
        self.data_dir = Path(service.data_dir)

    def call(self, method, path, auth=True, **kwargs):
        headers = {**(AUTH if auth else {}), **kwargs.pop("headers", {})}
        return requests.request(method, self.url + path, headers=headers, timeout=kwargs.pop("timeout", 180),
                                **kwargs)

    def get(self, path, **kwargs):
        return self.call("GET", path, **kwargs)

    def post(self, path, **kwargs):
        return self.call("POST", path, **kwargs)

    def put(self, path, **kwargs):
        return self.call("PUT", path, **kwargs)

    def delete(self, path, **kwargs):
        return self.call("DELETE", path, **kwargs)

    def query(self, sql, params=()):
        """Rows of `sql` (`?` placeholders) read straight from the stack's database,
        SQLite file or PostgreSQL (devtools.database_peek)."""
        with peek(self.service) as db:
            return db.execute(sql, params).fetchall()

    def notebook(self, name=None):
        name = name or f"notebook {time.monotonic_ns()}"
        response = self.post("/notebooks", json={"name": name, "description": "made by a test"})
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def wait_command(self, command_id, deadline=JOB_DEADLINE, until=("completed", "failed", "canceled")):
        end = time.monotonic() + deadline
        while True:
            command = self.get(f"/commands/{command_id}").json()
            if command["status"] in until:
                return command
            if time.monotonic() > end:
                raise AssertionError(f"{command_id} still {command['status']} after {deadline} s\n"
                                     + self.worker.log_text()[-3000:])
            time.sleep(0.1)  # polling a job's status with a deadline


def start_stack(data_dir, **extra_env):
    data_dir.mkdir(parents=True, exist_ok=True)
    env = notebook_env(data_dir, **extra_env)
    worker = Worker(data_dir, env)  # first: the model loads while the service starts
    try:
        service = services.start("notebook", data_dir, env=env)
    except BaseException:
        worker.stop()
        raise
    client = Client(service, worker)
    client.env = env
    return client


def stop_stack(client):
    took = client.service.stop(timeout=20.0)
    worker_took = client.worker.stop()
    assert took < 20 and worker_took < 20


def scaled_out_env(postgres_server, redis_server):
    """A new PostgreSQL database and a Redis database of its own: one stack's."""
    return {"DATABASE_URL": postgres_server.new_database(), "REDIS_URL": redis_server.new_url()}


def _shared_stack(tmp_path_factory, name, backend, links, **env):
    client = start_stack(tmp_path_factory.mktemp(f"{name}-{backend}") / "data", **env)
    client.links, client.backend = links, backend
    return client


@pytest.fixture(scope="session")
def nb_sqlite(tmp_path_factory, link_server):
    client = _shared_stack(tmp_path_factory, "notebook", "sqlite", link_server)
    yield client
    stop_stack(client)


@pytest.fixture(scope="session")
def nb_postgresql(tmp_path_factory, link_server, postgres_server, redis_server):
    client = _shared_stack(tmp_path_factory, "notebook", "postgresql", link_server,
                           **scaled_out_env(postgres_server, redis_server))
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

PROVIDER_HOST = "127.0.0.3"      # the fake providers; allowed by NOTEBOOK_MODEL_HOST_ALLOWLIST only
ENCRYPTION_KEY = "9vK3oqyJ1a7h0d8V2bqQm6YQ5bQ0m0n1R2j4b7c8d9E="
LLM_TIMEOUT = 3.0


@pytest.fixture(scope="session")
def fake_providers():
    from devtools.fake_providers import FakeProviders
    with FakeProviders(host=PROVIDER_HOST, keys={"openai": "sk-good", "anthropic": "ant-good"},
                       drip_seconds=LLM_TIMEOUT * 4) as fake:
        yield fake


def _llm_stack(tmp_path_factory, fake_providers, backend, **env):
    """A service + worker of its own for the model features: an encryption key, the
    fake providers allowed, a short model time-out, no embedding model to load."""
    client = _shared_stack(tmp_path_factory, "notebook-llm", backend, None,
                           NOTEBOOK_ENCRYPTION_KEY=ENCRYPTION_KEY,
                           NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
                           NOTEBOOK_LLM_TIMEOUT=str(LLM_TIMEOUT), NOTEBOOK_EMBEDDING_PROVIDER="none",
                           OPENAI_API_KEY="sk-good", OPENAI_BASE_URL=fake_providers.base_url("openai"),
                           ANTHROPIC_API_KEY="", OLLAMA_API_BASE="", **env)
    client.fake = fake_providers
    return client


@pytest.fixture(scope="session")
def llm_nb_sqlite(tmp_path_factory, fake_providers):
    client = _llm_stack(tmp_path_factory, fake_providers, "sqlite")
    yield client
    stop_stack(client)


@pytest.fixture(scope="session")
def llm_nb_postgresql(tmp_path_factory, fake_providers, postgres_server, redis_server):
    client = _llm_stack(tmp_path_factory, fake_providers, "postgresql",
                        **scaled_out_env(postgres_server, redis_server))
    yield client
    stop_stack(client)


@pytest.fixture(scope="module")
def llm_nb(db_backend, request):
    """The model features' service + worker, on the module's backend."""
    return request.getfixturevalue(f"llm_nb_{db_backend.name}")
