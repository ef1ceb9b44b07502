"""The notebook's own metrics on `/metrics`: its job backlog (queued, running, failed,
the oldest queued job's age), read from the database when scraped, whatever the job
worker is doing. The stack is the suite's shared one: counts are compared, not assumed."""

import os
import signal
import time
from pathlib import Path

import requests

from app.common.db import BOUNDED_READ_SECONDS
from devtools import services
from devtools.waiting import wait_for
from tests.support.metrics import scrape
from tests.support.notebook import notebook_env

JOBS = "bundle_notebook_jobs"
OLDEST = "bundle_notebook_oldest_queued_job_age_seconds"


def _add_async(nb, notebook_id, **fields):
    response = nb.post("/sources", json={"notebook_id": notebook_id, "async_processing": True, **fields})
    assert response.status_code == 202, response.text
    return response.json()


def test_metrics_need_no_password(nb):
    assert requests.get(nb.url + "/sources", timeout=10).status_code == 401
    assert requests.get(nb.url + "/metrics", timeout=10).status_code == 200


def test_job_backlog(nb, notebook_id):
    before = scrape(nb.service)
    gate_name = f"metrics-{time.monotonic_ns()}"
    gate = nb.links.gate(gate_name)
    blocker = _add_async(nb, notebook_id, type="link", url=f"{nb.links.base_url}/gate/{gate_name}", embed=False)
    wait_for(lambda: nb.get(f"/commands/{blocker['command_id']}").json()["status"] == "running", "the blocker runs")
    queued = _add_async(nb, notebook_id, type="text", content="Waiting behind the gate.", embed=False)
    try:
        waiting = wait_for(lambda: (m := scrape(nb.service)).value(OLDEST) >= 1.0 and m, "a job queued for 1 s")
        assert waiting.value(JOBS, state="queued") >= 1
        assert waiting.value(JOBS, state="running") >= 1
    finally:
        gate.set()
    assert nb.wait_command(blocker["command_id"])["status"] == "completed"
    assert nb.wait_command(queued["command_id"])["status"] == "completed"
    drained = scrape(nb.service)  # nothing waits now (the suite's tests run one at a time)
    assert drained.value(OLDEST) == 0
    assert drained.value(JOBS, state="queued") == 0
    assert drained.value(JOBS, state="running") == 0

    nb.links.state["flaky_ok"] = False
    failing = _add_async(nb, notebook_id, type="link", url=nb.links.base_url + "/flaky")
    assert nb.wait_command(failing["command_id"])["status"] == "failed"
    assert scrape(nb.service).value(JOBS, state="failed") == before.value(JOBS, state="failed") + 1


def _frozen(server):
    """The PIDs of a PostgreSQL server's processes (the postmaster, then its children):
    SIGSTOP to them all is a database host that stops answering, without a FIN or an
    RST (a powered-off or cut-off host, as the scraping worker sees it)."""
    postmaster = int(Path(server.data, "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


def test_a_scrape_answers_while_the_database_host_stops_answering(tmp_path):
    """The backlog's read (app.common.db.bounded_read) is bounded as a whole, not by the
    server's statement_timeout: with PostgreSQL frozen, a scrape answers within the bound
    without the backlog, the connection that timed out is dropped rather than pooled, and
    the series come back once the server answers again."""
    from devtools.pg_server import PostgresServer

    with PostgresServer() as server:  # a server of its own: the suite's would stall other tests
        env = notebook_env(tmp_path / "data", DATABASE_URL=server.new_database())
        log_path = tmp_path / "service.log"
        with open(log_path, "wb") as log:
            service = services.start("notebook", tmp_path / "data", env=env, stderr=log)
        try:
            assert scrape(service).value(JOBS, state="queued") == 0  # a pooled connection, idle now
            frozen = _frozen(server)
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            try:
                for _ in range(2):  # the pooled connection's ping, then a new connection's start
                    started = time.monotonic()
                    samples = scrape(service)
                    assert time.monotonic() - started < BOUNDED_READ_SECONDS + 3.0
                    assert samples.value(JOBS) is None
                    assert samples.value(OLDEST) is None
                    assert samples.value("bundle_http_requests_total") is not None
                    assert samples.value("bundle_db_pool_connections_in_use") == 0  # none left checked out
            finally:
                for pid in reversed(frozen):
                    os.kill(pid, signal.SIGCONT)
            samples = scrape(service)
            assert samples.value(JOBS, state="queued") == 0
            assert samples.value(OLDEST) == 0
            assert samples.value("bundle_db_pool_connections_in_use") == 0
            assert "could not be read for /metrics: TimeoutError" in log_path.read_text(errors="replace")
        finally:
            service.stop(timeout=20.0)
