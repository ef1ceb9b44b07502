"""The job queue: huey, consumed by the separate worker process (`python -m app.notebook
worker`), on its SQLite storage (DATA_DIR/jobs.db by default: one worker) or, with
REDIS_URL set, on its Redis storage (any number of workers, on any hosts).

What a job is about lives in our own `Command` rows (status, progress, result,
error), which the API shows; huey only carries "run command X". A command is
created in the same transaction as what it works on, and handed to huey after
that transaction commits, so the worker never sees a job before its data. Each
queue entry goes to one worker (SQLite: a delete in a transaction; Redis: BRPOP),
and a command runs at most once even when it was queued twice (processing.run
claims it by a compare-and-set on its status)."""

import logging
import os

from app.common import redis_client
from app.notebook.core import embeddings
from app.notebook.core.ids import public
from app.notebook.worker import processing
from app.notebook.worker.command_state import fail_unqueued, new_command

log = logging.getLogger("bundle.notebook")

# huey's key names start with `huey.` whatever the name; the name keeps them apart
# from any other huey queue of the same Redis database.
REDIS_QUEUE_NAME = "bundle_notebook"


def _huey(settings):
    if settings.redis_url:
        from huey import RedisHuey

        # The bundle's client (time-outs, a retry that absorbs a connection a restart
        # cut). A worker waits for a job in BRPOP, a second at a time.
        pool = redis_client.for_url(settings.redis_url).connection_pool
        return RedisHuey(name=REDIS_QUEUE_NAME, connection_pool=pool, results=False, blocking=True, read_timeout=1)
    from huey import SqliteHuey

    os.makedirs(os.path.dirname(settings.jobs_path), exist_ok=True)
    # strict_fifo: jobs run in the order they were queued (sources in the order added).
    return SqliteHuey(name="notebook", filename=settings.jobs_path, results=False, strict_fifo=True, timeout=10)


# A queued job names its task "<module of the task's function>.<task name>". Release 0.1.0
# ran the tasks from app.notebook.processing; they keep that module name, so a job queued
# by a web of another release (a queue not yet drained at an upgrade, hosts upgraded one
# at a time on one Redis queue, a rollback) is still found by this worker, and the reverse.
QUEUED_TASK_MODULE = "app.notebook.processing"
TASK_NAMES = ("process_source", "embed_source", "embed_note", "insight", "podcast", "rebuild_embeddings")


def _run_command(command_key):
    """processing.run, under the task module name every release queues jobs with."""
    return processing.run(command_key)


_run_command.__module__ = QUEUED_TASK_MODULE


class JobQueue:
    def __init__(self, settings):
        self.settings = settings
        self.huey = _huey(settings)
        self.on_redis = bool(settings.redis_url)
        # The worker's presence.Presence on Redis (set by the worker, which alone runs jobs).
        self.presence = None
        # No retries: a job that fails is `failed`; POST /sources/{id}/retry starts it again.
        self._tasks = {name: self.huey.task(name=name, retries=0)(_run_command) for name in TASK_NAMES}

    new_command = staticmethod(new_command)

    def describe(self):
        """Where the queue is, for the worker's start line (no password)."""
        if self.on_redis:
            return redis_client.describe_url(self.settings.redis_url)
        return self.settings.jobs_path

    def note_command(self, note):
        """A command embedding `note`, or None when no embedding model can be used."""
        if embeddings.unavailable_reason(self.settings):
            return None
        return self.new_command("embed_note", public("note", note.id))

    def enqueue(self, command) -> bool:
        """Hand `command` to the worker (after its transaction committed). When the
        queue's storage does not take it (Redis down), the command is failed at once
        (retry it) rather than left `new` with nothing to run it. False then."""
        if command is None:
            return True
        try:
            self.requeue(command)
        except Exception as exc:  # the storage's error, whichever storage
            log.error("command %s could not be queued: %s: %s", command.id, type(exc).__name__, exc)
            fail_unqueued(command, "the job queue is unavailable; retry later")
            return False
        return True

    def queued_command_keys(self) -> set[str]:
        """The commands the queue holds now (its whole list: a Redis LRANGE)."""
        return {task.args[0] for task in self.huey.pending() if task.args}

    def requeue(self, command):
        """Hand `command` to the worker; the storage's error when it does not take it."""
        self._tasks[command.kind](command.id)
