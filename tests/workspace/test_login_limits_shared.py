"""The sign-in limits on four workers sharing them through Redis: the configured
number of failures is allowed for the whole deployment, not for each worker."""

import requests

from devtools.waiting import wait_for
from tests.support.shared import serving_pid
from tests.support.workspace import MESH_ENV, OWNER, Workspace

WORKERS = 4
LIMIT = 5


def test_the_sign_in_limit_counts_the_failures_of_every_worker_together(start_service, redis_server, postgres_server):
    service = start_service(
        "workspace",
        workers=WORKERS,
        env={
            "REDIS_URL": redis_server.new_url(),
            "DATABASE_URL": postgres_server.new_database(),
            **MESH_ENV,
            "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": str(LIMIT),
            "WORKSPACE_LOGIN_RATE_PER_ADDRESS": "1000",
            "WORKSPACE_LOGIN_DELAY_SECONDS": "3600",
        },
    )  # no test waits that out, however slow the machine
    wait_for(lambda: len(service.worker_pids()) == WORKERS, f"{WORKERS} workers")
    ws = Workspace(service)
    ws.first_user()
    pids, attempts = set(service.worker_pids()), []  # (worker pid, status) of each attempt

    def attempt():
        # A connection of its own, so that the kernel hands it to any worker.
        response = requests.post(
            ws.api + "/users/login", json={"email": OWNER["email"], "password": "wrong"}, stream=True, timeout=30
        )
        attempts.append((serving_pid(service, response), response.status_code))
        response.close()
        return {pid for pid, status in attempts if status == 429} == pids

    wait_for(attempt, "a refusal from every worker")
    statuses = [status for _, status in attempts]
    # Counted per worker, each worker would have allowed LIMIT failures before refusing one.
    assert statuses == [401] * LIMIT + [429] * (len(statuses) - LIMIT), attempts
    limited = requests.post(
        ws.api + "/users/login", json={"email": OWNER["email"], "password": OWNER["password"]}, timeout=30
    )
    assert limited.status_code == 429 and 3000 < int(limited.headers["Retry-After"]) <= 3600
    # From another address (nginx's X-Real-IP), the right password passes at once.
    elsewhere = requests.post(
        ws.api + "/users/login",
        json={"email": OWNER["email"], "password": OWNER["password"]},
        headers={"X-Real-IP": "198.51.100.5"},
        timeout=30,
    )
    assert elsewhere.status_code == 201, elsewhere.text
