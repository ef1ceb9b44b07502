"""A queued job names its task by module and name: the names every release queues with
stay those of release 0.1.0 (app.notebook.processing.<task>), so a job queued by a web
of another release (an undrained queue at an upgrade, hosts upgraded one at a time on
one Redis queue, a rollback) is found by the worker."""

from app.notebook.settings import NotebookSettings
from app.notebook.worker.jobs import TASK_NAMES, JobQueue

RELEASE_0_1_0_TASKS = {
    "app.notebook.processing.process_source",
    "app.notebook.processing.embed_source",
    "app.notebook.processing.embed_note",
    "app.notebook.processing.insight",
    "app.notebook.processing.podcast",
}
# Tasks added since, under the same module name. A worker of an older release does not
# know them: it drops such a message and the command stays `new`, until a worker of
# this release starts and queues every `new` command again (processing.requeue_waiting).
LATER_TASKS = {"app.notebook.processing.rebuild_embeddings"}


def test_the_worker_finds_the_tasks_release_0_1_0_queued(tmp_path, monkeypatch):
    for name in ("DATABASE_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOTEBOOK_ALLOW_NO_PASSWORD", "1")
    queue = JobQueue(NotebookSettings.from_env(str(tmp_path)))
    registry = queue.huey._registry  # huey's own look-up of a dequeued message's task name
    for queued_name in RELEASE_0_1_0_TASKS:
        assert registry.string_to_task(queued_name).__name__ == queued_name.rsplit(".", 1)[1]
    made_now = {registry.task_to_string(type(task.s("c"))) for task in queue._tasks.values()}
    assert made_now == RELEASE_0_1_0_TASKS | LATER_TASKS
    assert len(TASK_NAMES) == len(RELEASE_0_1_0_TASKS | LATER_TASKS)
