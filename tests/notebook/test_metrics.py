"""The notebook's own metrics on `/metrics`: its job backlog (queued, running, failed,
the oldest queued job's age), read from the database when scraped, whatever the job
worker is doing. The stack is the suite's shared one: counts are compared, not assumed."""

import time

import requests

from devtools.waiting import wait_for
from tests.support.metrics import scrape

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
