"""A service's life under systemd, as devtools.services reproduces it: the listening
socket held by the parent (bundle@.socket), READY=1 only once every worker has loaded
the app, a restart and a reload (gunicorn_systemd.py) that refuse no connection and
fail no request, and a reload of code that does not load refused while the old workers
keep serving. The deck service: cheap to start, and it has writes to make."""

import json
import os
import shutil
import threading
import time

import pytest
import requests

from devtools import services
from devtools.waiting import wait_for
from devtools.worker_sockets import socket_inodes
from tests.support.decks import copy_sample_deck
from tests.support.shared import ROOT

WORKERS = 2
CLIENTS = 4
# Not copied into a tree the tests change: the venv (the copy runs this checkout's),
# the data of `make run`, git's, and what Python and the tools write.
NOT_COPIED = shutil.ignore_patterns(".venv", "var", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", "node_modules")


def copy_of_the_checkout(target):
    shutil.copytree(ROOT, target, ignore=NOT_COPIED)
    return target


def state(service):
    return json.loads((service.runtime_dir / "gunicorn.json").read_text())


class Load:
    """Clients that read and write (a note on a session) in a loop, each request on a
    new connection (what a restart can refuse is a connection), counting answers,
    5xx answers and connection errors."""

    def __init__(self, service):
        self.service = service
        imported = requests.post(f"{service.base_url}/api/decks/import", json=service.import_body, timeout=30)
        assert imported.status_code in (200, 201), imported.text
        session = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10)
        assert session.status_code in (200, 201), session.text
        self.session = session.json()["id"]
        self.answers, self.server_errors, self.connection_errors, self.acknowledged = 0, [], [], []
        self.longest = 0.0  # seconds, the longest request (one that waited on the queue)
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.clients = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(CLIENTS)]

    def run(self, n):
        base = self.service.base_url
        while not self.stopping.is_set():
            write = n % 2 == 1
            began = time.monotonic()
            try:
                if write:
                    body = {"type": "note", "slide": 0, "text": f"client {n}"}
                    response = requests.post(f"{base}/api/sessions/{self.session}/events", json=body, timeout=30)
                else:
                    response = requests.get(f"{base}/api/decks", timeout=30)
            except requests.ConnectionError as exc:
                with self.lock:
                    self.connection_errors.append(repr(exc)[:200])
                continue
            with self.lock:
                self.answers += 1
                self.longest = max(self.longest, time.monotonic() - began)
                if response.status_code >= 500:
                    self.server_errors.append((response.status_code, response.text[:200]))
                elif write and response.status_code == 201:
                    self.acknowledged.append(response.json()["seq"])

    def __enter__(self):
        for client in self.clients:
            client.start()
        wait_for(lambda: self.answers >= 20, "the first answers")
        return self

    def more_answers(self, count):
        mark = self.answers
        wait_for(lambda: self.answers >= mark + count, f"{count} more answers")

    def __exit__(self, *exc):
        self.stopping.set()
        for client in self.clients:
            client.join(60)

    def missing_writes(self):
        """The acknowledged writes the session's log does not hold."""
        stored, after = set(), 0
        while True:
            page = requests.get(
                f"{self.service.base_url}/api/sessions/{self.session}/events",
                params={"after": after, "limit": 1000},
                timeout=30,
            ).json()
            stored.update(event["seq"] for event in page["events"])
            if not page["has_more"]:
                return sorted(set(self.acknowledged) - stored)
            after = page["next_after"]

    def report(self, what):
        print(
            f"{what}: {self.answers} answers ({len(self.acknowledged)} acknowledged writes), "
            f"{len(self.server_errors)} 5xx, {len(self.connection_errors)} connection errors, "
            f"longest request {self.longest:.2f} s"
        )


def decks(start_service, tmp_path, **kwargs):
    data_dir = tmp_path / "decks-data"
    data_dir.mkdir()
    body = copy_sample_deck(data_dir)
    service = start_service("decks", data_dir=data_dir, workers=WORKERS, **kwargs)
    service.import_body = body
    return service


def test_gunicorn_serves_on_the_socket_the_parent_holds(start_service, tmp_path):
    service = decks(start_service, tmp_path)
    held = os.fstat(service.listener.fileno()).st_ino
    assert held in socket_inodes(service.process.pid)  # LISTEN_FDS taken: not a socket of its own
    assert requests.get(service.base_url + "/healthz", timeout=10).status_code == 200


def test_ready_only_once_every_worker_has_loaded_the_app(tmp_path):
    """Each worker of a copy of the checkout loads the app only when the test opens
    its gate: with one of two loaded, the start has not heard READY=1."""
    root = copy_of_the_checkout(tmp_path / "tree")
    gates = tmp_path / "gates"
    gates.mkdir()
    wsgi = root / "wsgi.py"
    wsgi.write_text(
        "import os, pathlib, time\n"
        f"while not (pathlib.Path({str(gates)!r}) / str(os.getpid())).exists():\n"
        "    time.sleep(0.05)  # the test opens the gate\n" + wsgi.read_text()
    )
    (tmp_path / "data").mkdir()
    listener = services.listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    service = services.RunningService("decks", port, tmp_path / "data", listener=listener, workers=WORKERS, root=root)
    launched = threading.Event()
    starter = threading.Thread(target=lambda: (service.launch(), launched.set()), daemon=True)
    starter.start()
    try:
        wait_for(lambda: service.process is not None and len(service.worker_pids()) == WORKERS, "two workers")
        first, second = sorted(service.worker_pids())

        (gates / str(first)).touch()
        loaded_one = wait_for(lambda: state_if(service, lambda s: s["loaded"] == [first]), "the first worker loaded")
        assert loaded_one["ready"] is False
        assert not launched.is_set()  # no READY=1 yet

        (gates / str(second)).touch()
        assert launched.wait(60)
        # The first READY=1 systemd would hear came with both workers counted (had one
        # gone out earlier, gunicorn's own or with one worker, it would be this one).
        assert f"STATUS={WORKERS} of {WORKERS} workers serving" in service.ready_message.splitlines()
        assert state(service) == {
            "master": service.process.pid,
            "workers": [first, second],
            "loaded": [first, second],
            "ready": True,
        }
        assert requests.get(service.base_url + "/healthz", timeout=10).status_code == 200
    finally:
        for pid in service.worker_pids() if service.process else ():
            (gates / str(pid)).touch()
        starter.join(60)
        service.stop()


def state_if(service, condition):
    try:
        found = state(service)
    except (OSError, ValueError):
        return None
    return found if condition(found) else None


def test_a_restart_under_the_held_socket_fails_no_request(start_service, tmp_path):
    service = decks(start_service, tmp_path)
    with Load(service) as load:
        old_master = service.process.pid
        took = service.restart()
        load.more_answers(100)
    load.report(f"restart (stop {took:.1f} s)")
    assert service.process.pid != old_master
    assert load.connection_errors == [] and load.server_errors == []
    assert load.acknowledged and load.missing_writes() == []


def test_a_reload_fails_no_request_and_replaces_every_worker(start_service, tmp_path):
    service = decks(start_service, tmp_path)
    old = set(service.worker_pids())
    with Load(service) as load:
        done = service.reload()
        load.more_answers(100)
    load.report("reload")
    print(done.stdout.strip())
    new = set(service.worker_pids())
    assert len(new) == WORKERS and not new & old
    assert state(service)["workers"] == sorted(new) and state(service)["ready"]
    assert load.connection_errors == [] and load.server_errors == []
    assert load.acknowledged and load.missing_writes() == []


BROKEN = {
    # a syntax error in a module the app imports
    "syntax": ("app/decks/api.py", lambda text: text + "\ndef broken(:\n", ("SyntaxError", "api.py")),
    # the module imports, but what gunicorn loads from it (wsgi:app) is gone
    "no app": (
        "wsgi.py",
        lambda text: text.replace("    app = create_app(", "    application = create_app("),
        ("app",),
    ),
}


@pytest.mark.parametrize("breakage", BROKEN)
def test_a_reload_of_code_that_does_not_load_is_refused_and_the_old_workers_serve(start_service, tmp_path, breakage):
    root = copy_of_the_checkout(tmp_path / "tree")
    service = decks(start_service, tmp_path, root=root)
    old = set(service.worker_pids())
    path, breaking, named = BROKEN[breakage]
    source = root / path
    broken = breaking(source.read_text())
    assert broken != source.read_text()
    source.write_text(broken)

    done = service.reload(check=False)
    print(done.stdout)
    assert done.returncode != 0 and "reload refused" in done.stdout
    assert all(word in done.stdout for word in named)
    assert set(service.worker_pids()) == old and service.process.poll() is None
    assert requests.get(service.base_url + "/api/decks", timeout=10).status_code == 200
