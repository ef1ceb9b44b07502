"""The general rule: restarting any one process of a service while requests run on the
others never fails one of those requests. Here, for each service, one of two gunicorn
workers is stopped gracefully (gunicorn boots a replacement, which opens the service's
data on its own) while clients keep reading through the other; every answer must be a
200. (The notebook, with its job worker, is in tests/notebook/test_restarts.py.)"""

import os
import signal
import threading

import pytest
import requests

from app import registry
from devtools.waiting import wait_for
from tests.support.workspace import MESH_ENV

CLIENTS = 4


def _workspace_reader(service):
    first = requests.post(
        f"{service.base_url}/api/v2/users/first",
        json={"email": "owner@example.com", "username": "owner", "name": "Owner", "password": "a long passphrase 42"},
        timeout=30,
    )
    assert first.status_code == 201, first.text
    token = first.json()["session_token"]
    return "/api/v2/users/me", {"Workspace-Session-Token": token}


READERS = {
    "decks": lambda service: ("/api/decks", {}),
    "audio": lambda service: ("/api/audio/capabilities", {}),
    "wizard": lambda service: ("/api/collections/wizards", {"X-Wiz-Test-User": "alice", "X-Wiz-Test-Groups": ""}),
    "workspace": _workspace_reader,
}
ENVIRONMENTS = {"wizard": {"WIZ_ALLOW_TEST_IDENTITY": "1"}}
# Services whose workers share state through Redis: gunicorn.conf.py refuses two workers without it.
NEED_REDIS = {s.name for s in registry.SERVICES if s.needs_redis_to_scale}


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_worker_restarted_while_requests_run_fails_none_of_them(start_service, name, request):
    env = dict(ENVIRONMENTS.get(name, {}))
    if name in NEED_REDIS:
        env.update(REDIS_URL=request.getfixturevalue("redis_server").new_url(), **MESH_ENV)
    service = start_service(name, workers=2, env=env)
    path, headers = READERS[name](service)
    statuses, failures, stopping = [], [], threading.Event()

    def read():
        while not stopping.is_set():
            response = requests.get(service.base_url + path, headers=headers, timeout=30)
            statuses.append(response.status_code)
            if response.status_code != 200:
                failures.append(response.text[:300])

    clients = [threading.Thread(target=read, daemon=True) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    try:
        wait_for(lambda: len(statuses) >= 40, "the first reads")
        old = set(service.worker_pids())
        os.kill(sorted(old)[0], signal.SIGTERM)
        wait_for(
            lambda: len(set(service.worker_pids()) - old) == 1 and len(service.worker_pids()) == 2,
            "the replacement worker",
        )
        mark = len(statuses)
        wait_for(lambda: len(statuses) >= mark + 80, "reads after the restart")
    finally:
        stopping.set()
        for client in clients:
            client.join(60)
    assert failures == [] and set(statuses) == {200}
