"""The notebook scaled out: its database on PostgreSQL and its job queue on Redis,
with several job workers (`python -m app.notebook worker`) taking jobs from one
queue. Each job runs exactly once whichever worker takes it; a worker that starts
leaves the jobs another one runs alone, and fails those of a worker that died; the
queue survives a Redis restart (what Redis acknowledged is in its append-only file)
and the workers reconnect; a job the queue cannot take while Redis is down is
failed at once, and retried once it is back.

Each test has its own database, Redis server and processes; the jobs are link
sources whose pages (tests/notebook/conftest.py's link server) count their hits
and, for /gate/<name>, hold the job until the test opens the gate."""

import uuid

import pytest
import redis

from devtools import services
from devtools.redis_server import RedisServer
from devtools.waiting import wait_for
from tests.support.notebook import PROVIDER_HOST, Client, Worker, notebook_env

JOBS = 12
PROCESS_STOP = 20.0


class Stack:
    """One web worker and any number of job workers on one database and one queue."""

    def __init__(self, data_dir, env, links):
        self.data_dir, self.env, self.links = data_dir, env, links
        self.workers = []
        self.service = services.start("notebook", data_dir, env=env)
        self.client = Client(self.service, None)

    def add_worker(self):
        worker = Worker(self.data_dir, self.env, name=f"worker-{len(self.workers) + 1}")
        self.workers.append(worker)
        self.client.worker = worker
        wait_for(lambda: "notebook worker:" in worker.log_text(), "the job worker's start")
        return worker

    def add_link(self, notebook_id, path):
        response = self.client.post(
            "/sources",
            json={
                "type": "link",
                "notebook_id": notebook_id,
                "embed": False,
                "url": f"{self.links.base_url}{path}",
                "async_processing": True,
            },
        )
        assert response.status_code == 202, response.text
        return response.json()

    def status(self, command_id):
        return self.client.get(f"/commands/{command_id}").json()["status"]

    def close(self):
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.stop(PROCESS_STOP)
        self.service.stop(timeout=PROCESS_STOP)


@pytest.fixture
def redis_of_its_own():
    """A Redis server for one test, which may restart or stop it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def scaled(tmp_path, postgres_server, redis_of_its_own, link_server):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = notebook_env(
        data_dir,
        DATABASE_URL=postgres_server.new_database(),
        REDIS_URL=redis_of_its_own.url(1),
        NOTEBOOK_EMBEDDING_PROVIDER="none",
        NOTEBOOK_FETCH_TIMEOUT="120",
        NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
    )
    stack = Stack(data_dir, env, link_server)
    stack.redis = redis_of_its_own
    yield stack
    stack.close()


def _page(tag, i):
    return f"/page/{tag}-{i}"


def _logs(stack):
    return "".join(worker.log_text() for worker in stack.workers)


def test_several_workers_run_each_job_exactly_once(scaled):
    nb, links, tag = scaled.client, scaled.links, uuid.uuid4().hex
    first, second = scaled.add_worker(), scaled.add_worker()
    notebook = nb.notebook()
    # Both workers held by a job each...
    gated = []
    for gate in ("a", "b"):
        gated.append(scaled.add_link(notebook, f"/gate/{tag}-{gate}"))
        wait_for(lambda: scaled.status(gated[-1]["command_id"]) == "running", "a gated job's start")
    # ...jobs queued behind them, and a third worker started: it queues every waiting
    # command again (a queue entry lost between a commit and its enqueue would be
    # found so), runs each once and skips the copies, and leaves the running jobs alone.
    queued = [scaled.add_link(notebook, _page(tag, i)) for i in range(JOBS)]
    third = scaled.add_worker()
    for added in queued:
        assert nb.wait_command(added["command_id"])["status"] == "completed"
    assert [scaled.status(added["command_id"]) for added in gated] == ["running", "running"]
    for gate in ("a", "b"):
        links.gate(f"{tag}-{gate}").set()
    # Then all three take jobs from the queue.
    more = [scaled.add_link(notebook, _page(tag, JOBS + i)) for i in range(JOBS)]
    for added in [*gated, *more]:
        assert nb.wait_command(added["command_id"])["status"] == "completed"
    wait_for(lambda: _logs(scaled).count("skipped: it is no longer queued") == JOBS, "the copies skipped")

    hits = links.state["hits"]
    assert [hits.get(_page(tag, i)) for i in range(2 * JOBS)] == [1] * (2 * JOBS)
    assert hits[f"/gate/{tag}-a"] == hits[f"/gate/{tag}-b"] == 1
    sources = nb.get(f"/sources?notebook_id={notebook}&limit=100").json()
    assert len(sources) == 2 * JOBS + 2 and {s["status"] for s in sources} == {"completed"}
    assert [w.process.poll() for w in (first, second, third)] == [None, None, None]


def test_the_job_of_a_worker_that_died_is_failed_by_another_and_can_be_retried(scaled):
    nb, links, tag = scaled.client, scaled.links, uuid.uuid4().hex
    survivor = scaled.add_worker()
    notebook = nb.notebook()
    first = scaled.add_link(notebook, f"/gate/{tag}-first")
    wait_for(lambda: scaled.status(first["command_id"]) == "running", "the first gated job's start")
    doomed_job = scaled.add_link(notebook, f"/gate/{tag}-doomed")
    # The second worker queues the waiting job again at its start and runs it; the
    # survivor, once free, gets the copy and skips it, leaving the job's holder alone.
    doomed = scaled.add_worker()
    wait_for(lambda: scaled.status(doomed_job["command_id"]) == "running", "the doomed job's start")
    links.gate(f"{tag}-first").set()
    assert nb.wait_command(first["command_id"])["status"] == "completed"
    key = doomed_job["command_id"].split(":")[1]
    wait_for(lambda: f"command {key} skipped" in survivor.log_text(), "the copy skipped")
    holders = redis.Redis.from_url(scaled.env["REDIS_URL"]).hkeys(f"bundle:notebook:jobs:holders:{key}")
    assert [holder.decode().split(":")[1] for holder in holders] == [str(doomed.process.pid)]

    doomed.process.kill()
    doomed.process.wait()
    # The survivor's next sweep finds the job's worker gone.
    failed = nb.wait_command(doomed_job["command_id"])
    assert failed["status"] == "failed" and "worker stopped" in failed["error_message"], failed
    assert nb.get(f"/sources/{doomed_job['id']}/status").json()["status"] == "failed"
    links.gate(f"{tag}-doomed").set()
    retried = nb.post(f"/sources/{doomed_job['id']}/retry")
    assert retried.status_code == 202, retried.text
    assert nb.wait_command(retried.json()["command_id"])["status"] == "completed"
    assert survivor.process.poll() is None


def test_queued_jobs_survive_a_redis_restart_and_the_workers_reconnect(scaled):
    nb, links, tag = scaled.client, scaled.links, uuid.uuid4().hex
    worker = scaled.add_worker()
    notebook = nb.notebook()
    # The worker idles in BRPOP when Redis restarts: it reconnects and takes the next job.
    scaled.redis.restart()
    after_idle = scaled.add_link(notebook, _page(tag, "after-idle"))
    assert nb.wait_command(after_idle["command_id"])["status"] == "completed"
    # Jobs queued behind a running one are still queued after a restart.
    gated = scaled.add_link(notebook, f"/gate/{tag}")
    wait_for(lambda: scaled.status(gated["command_id"]) == "running", "the gated job's start")
    queued = [scaled.add_link(notebook, _page(tag, i)) for i in range(3)]
    assert {scaled.status(added["command_id"]) for added in queued} == {"new"}
    scaled.redis.restart()
    links.gate(tag).set()
    for added in [gated, *queued]:
        assert nb.wait_command(added["command_id"])["status"] == "completed"
    # The web worker reconnects too: a job queued after the restart runs.
    last = scaled.add_link(notebook, _page(tag, "last"))
    assert nb.wait_command(last["command_id"])["status"] == "completed"
    hits = links.state["hits"]
    assert [hits.get(_page(tag, i)) for i in (*range(3), "after-idle", "last")] == [1] * 5
    assert worker.process.poll() is None


def test_a_job_queued_while_redis_is_down_fails_at_once_and_is_retried_after(scaled):
    nb, tag = scaled.client, uuid.uuid4().hex
    worker = scaled.add_worker()
    notebook = nb.notebook()
    cred = nb.post(
        "/credentials",
        json={"name": "closed", "provider": "openai_compatible", "base_url": f"http://{PROVIDER_HOST}:9/v1"},
    )
    assert cred.status_code == 201, cred.text
    made = nb.post(
        "/models",
        json={"name": "m", "provider": "openai_compatible", "type": "language", "credential": cred.json()["id"]},
    )
    assert made.status_code == 201, made.text
    model = made.json()["id"]
    scaled.redis.stop()
    try:
        added = scaled.add_link(notebook, _page(tag, "down"))
        assert added["status"] == "failed" and "job queue is unavailable" in added["error_message"], added
        command = nb.get(f"/commands/{added['command_id']}").json()
        assert command["status"] == "failed" and "job queue is unavailable" in command["error_message"]
        # A synchronous add says so and changes nothing.
        sync = nb.post("/sources", json={"type": "text", "notebook_id": notebook, "content": "Tides.", "embed": False})
        assert sync.status_code == 400 and "job queue is unavailable" in sync.json()["detail"], sync.text
        # A podcast: 503 (as /embed), its episode kept with its job failed, to retry.
        episode = nb.post("/podcasts/generate", json={"episode_name": "Down", "content": "Tides.", "model_id": model})
        assert episode.status_code == 503 and "job queue is unavailable" in episode.json()["detail"], episode.text
        [kept] = nb.get("/podcasts/episodes").json()
        assert kept["job_status"] == "failed", kept
    finally:
        scaled.redis.start()
    remade = nb.post(f"/podcasts/episodes/{kept['id']}/retry")
    assert remade.status_code == 202, remade.text
    retried = nb.post(f"/sources/{added['id']}/retry")
    assert retried.status_code == 202, retried.text
    assert nb.wait_command(retried.json()["command_id"])["status"] == "completed"
    assert scaled.links.state["hits"][_page(tag, "down")] == 1
    assert len(nb.get(f"/sources?notebook_id={notebook}").json()) == 1
    assert worker.process.poll() is None
