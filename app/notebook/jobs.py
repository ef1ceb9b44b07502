"""The job queue: huey with its SQLite storage (DATA_DIR/jobs.db by default),
consumed by the separate worker process (`python -m app.notebook worker`).

What a job is about lives in our own `Command` rows (status, progress, result,
error), which the API shows; huey only carries "run command X". A command is
created in the same transaction as what it works on, and handed to huey after
that transaction commits, so the worker never sees a job before its data."""
import logging
import os

from huey import SqliteHuey

from app.notebook import embeddings, processing
from app.notebook.command_state import new_command
from app.notebook.ids import public

log = logging.getLogger("bundle.notebook")


class JobQueue:
    def __init__(self, settings):
        self.settings = settings
        os.makedirs(os.path.dirname(settings.jobs_path), exist_ok=True)
        # strict_fifo: jobs run in the order they were queued (sources in the order added).
        self.huey = SqliteHuey(name="notebook", filename=settings.jobs_path, results=False,
                               strict_fifo=True, timeout=10)
        # No retries: a job that fails is `failed`; POST /sources/{id}/retry starts it again.
        self._tasks = {
            "process_source": self.huey.task(name="process_source", retries=0)(processing.run),
            "embed_source": self.huey.task(name="embed_source", retries=0)(processing.run),
            "embed_note": self.huey.task(name="embed_note", retries=0)(processing.run),
            "insight": self.huey.task(name="insight", retries=0)(processing.run),
            "podcast": self.huey.task(name="podcast", retries=0)(processing.run),
        }

    new_command = staticmethod(new_command)

    def note_command(self, note):
        """A command embedding `note`, or None when no embedding model can be used."""
        if embeddings.unavailable_reason(self.settings):
            return None
        return self.new_command("embed_note", public("note", note.id))

    def enqueue(self, command):
        """Hand `command` to the worker (after its transaction committed)."""
        if command is not None:
            self._tasks[command.kind](command.id)
