"""Restarting any one process of the notebook (its job worker, one web worker) while
requests run on the others never fails one of those requests.

What broke it: every process that opened the database wrote the full-text index's
rank configuration again, and the next text search of every other process failed
("SQL logic error", a 500) after an admin restarted `bundle-worker@notebook`.
"""

import os
import signal
import threading

from devtools import services
from devtools.waiting import wait_for
from tests.support import documents
from tests.support.notebook import Client, Worker, notebook_env

SEARCHERS = 4


class Searches:
    """Text and vector-free searches from several threads until stopped; every answer's status kept."""

    def __init__(self, client, notebook_id):
        self.client, self.notebook_id = client, notebook_id
        self.statuses, self.failures, self.stopping = [], [], threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(SEARCHERS)]

    def _run(self):
        while not self.stopping.is_set():
            response = self.client.post(
                "/search",
                json={"query": "photosynthesis chlorophyll", "type": "text", "notebook_id": self.notebook_id},
                timeout=30,
            )
            self.statuses.append(response.status_code)
            if response.status_code != 200:
                self.failures.append(response.text[:300])

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def answered(self):
        return len(self.statuses)

    def __exit__(self, *exc):
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)


def test_restarting_the_job_worker_or_a_web_worker_never_fails_a_request_on_the_others(tmp_path, db_backend, request):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    backend = db_backend.env()
    if backend:  # scaled out: the job queue on Redis too
        backend["REDIS_URL"] = request.getfixturevalue("redis_server").new_url()
    env = notebook_env(data_dir, NOTEBOOK_EMBEDDING_PROVIDER="none", **backend)
    worker = Worker(data_dir, env)
    service = services.start("notebook", data_dir, env=env, workers=2)
    client = Client(service, worker)
    try:
        notebook_id = client.notebook()
        added = client.post(
            "/sources",
            json={"type": "text", "notebooks": [notebook_id], "title": "Plants", "content": documents.TEXT_BODY},
        )
        assert added.status_code == 201, added.text
        with Searches(client, notebook_id) as searches:
            wait_for(lambda: searches.answered() >= 20, "the first searches")

            # The job worker restarted, as `systemctl restart bundle-worker@notebook` does.
            worker.stop()
            worker = client.worker = Worker(data_dir, env)
            wait_for(lambda: "notebook worker:" in worker.log_text(), "the job worker's start")
            mark = searches.answered()
            wait_for(lambda: searches.answered() >= mark + 40, "searches after the job worker's restart")

            # One web worker restarted gracefully: gunicorn boots a new one, which opens the database.
            old = set(service.worker_pids())
            os.kill(sorted(old)[0], signal.SIGTERM)
            wait_for(
                lambda: len(set(service.worker_pids()) - old) == 1 and len(service.worker_pids()) == 2,
                "the replacement web worker",
            )
            mark = searches.answered()
            wait_for(lambda: searches.answered() >= mark + 40, "searches after the web worker's restart")
        assert searches.failures == [] and set(searches.statuses) == {200}
    finally:
        service.stop()
        worker.stop()
