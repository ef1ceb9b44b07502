"""The notebook's test helpers: its client (`Client`), its job worker (`Worker`),
a whole stack (`start_stack`, `stop_stack`), the link server's handler
(`LinkHandler`), and the settings the suite runs with. devtools/release_dumps.py
uses the password and the encryption key too."""

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from devtools import services
from devtools.database_peek import peek
from tests.support import documents
from tests.support.shared import ROOT

PASSWORD = "test-password-9f3a"
AUTH = {"Authorization": f"Bearer {PASSWORD}"}
LINK_HOST = "127.0.0.2"  # allowed by NOTEBOOK_URL_ALLOWLIST; 127.0.0.1 stays forbidden
MAX_UPLOAD = 2 * 1024 * 1024  # small cap, so that 413 is cheap to reach
MAX_TEXT = 2 * 1024 * 1024  # a body without a file (NOTEBOOK_MAX_TEXT_BYTES), small for the same reason
MAX_CHARS = 1_000_000  # a source's or a note's text (NOTEBOOK_MAX_SOURCE_CHARS)
JOB_DEADLINE = 120.0  # the worker's first job waits for the model to load

# The model features' stack (tests/notebook/conftest.py: `llm_nb`).
PROVIDER_HOST = "127.0.0.3"  # the fake providers; allowed by NOTEBOOK_MODEL_HOST_ALLOWLIST only
ENCRYPTION_KEY = "9vK3oqyJ1a7h0d8V2bqQm6YQ5bQ0m0n1R2j4b7c8d9E="
LLM_TIMEOUT = 3.0


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


def notebook_env(data_dir, **extra):
    return {
        "NOTEBOOK_PASSWORD": PASSWORD,
        "NOTEBOOK_URL_ALLOWLIST": f"{LINK_HOST}/32",
        "NOTEBOOK_MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
        "NOTEBOOK_MAX_TEXT_BYTES": str(MAX_TEXT),
        "NOTEBOOK_MAX_SOURCE_CHARS": str(MAX_CHARS),
        "DATA_DIR": str(data_dir),
        **extra,
    }


class Worker:
    """`python -m app.notebook worker` on a DATA_DIR, its log in a file."""

    def __init__(self, data_dir, env, name="worker"):
        self.log_path = Path(data_dir) / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.notebook", "worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

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
        return requests.request(method, self.url + path, headers=headers, timeout=kwargs.pop("timeout", 180), **kwargs)

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
                raise AssertionError(
                    f"{command_id} still {command['status']} after {deadline} s\n" + self.worker.log_text()[-3000:]
                )
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


def shared_stack(tmp_path_factory, name, backend, links, **env):
    """A stack for a session-scoped fixture: `.links` (the link server) and `.backend` set."""
    client = start_stack(tmp_path_factory.mktemp(f"{name}-{backend}") / "data", **env)
    client.links, client.backend = links, backend
    return client


def llm_stack(tmp_path_factory, fake_providers, backend, **env):
    """A service + worker of its own for the model features: an encryption key, the
    fake providers allowed, a short model time-out, no embedding model to load."""
    client = shared_stack(
        tmp_path_factory,
        "notebook-llm",
        backend,
        None,
        NOTEBOOK_ENCRYPTION_KEY=ENCRYPTION_KEY,
        NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
        NOTEBOOK_LLM_TIMEOUT=str(LLM_TIMEOUT),
        NOTEBOOK_EMBEDDING_PROVIDER="none",
        OPENAI_API_KEY="sk-good",
        OPENAI_BASE_URL=fake_providers.base_url("openai"),
        ANTHROPIC_API_KEY="",
        OLLAMA_API_BASE="",
        **env,
    )
    client.fake = fake_providers
    return client


@contextmanager
def restored(nb: Any, *paths: str) -> Iterator[list[Any]]:
    """The documents at `paths` as they were (GET), put back (PUT) on leaving: the
    stacks are shared between modules, so a test that changes the settings, the
    default models or the default prompt leaves them as it found them. Yields them."""
    answers = [nb.get(path) for path in paths]
    assert all(answer.status_code == 200 for answer in answers), [answer.text for answer in answers]
    before = [answer.json() for answer in answers]
    try:
        yield before
    finally:
        for path, document in zip(paths, before, strict=True):
            answer = nb.put(path, json=document)
            assert answer.status_code == 200, f"{path} not set back: {answer.text}"


def credential(nb, provider, key=None, base_url=None, name=None):
    body = {
        "name": name or f"{provider} {time.monotonic_ns()}",
        "provider": provider,
        "base_url": base_url or nb.fake.base_url("openai" if provider == "openai_compatible" else provider),
    }
    if key:
        body["api_key"] = key
    response = nb.post("/credentials", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def model(nb, name, provider, cred, kind="language"):
    response = nb.post("/models", json={"name": name, "provider": provider, "type": kind, "credential": cred["id"]})
    assert response.status_code == 201, response.text
    return response.json()


def add_text_source(nb, notebook_id, title, content):
    response = nb.post(
        "/sources",
        json={"type": "text", "notebook_id": notebook_id, "title": title, "content": content, "embed": False},
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def add_note(nb, notebook_id, title, content):
    response = nb.post("/notes", json={"title": title, "content": content, "notebook_id": notebook_id})
    assert response.status_code == 201, response.text
    return response.json()["id"]
