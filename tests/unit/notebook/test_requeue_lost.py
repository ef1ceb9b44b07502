"""processing.requeue_lost, the workers' sweep for queue entries a Redis failover lost
(tests/notebook/test_queue_failover.py makes that loss with real sentinels): only a
`new` command older than the sweep's period that the queue does not hold is queued
again; a command just committed (its web worker is about to queue it), one the queue
holds, and one that runs or ran are left alone."""

from datetime import timedelta

from app.notebook.core.migrations import open_database
from app.notebook.core.models import Command, database, now
from app.notebook.worker.processing import requeue_lost


class RecordingQueue:
    def __init__(self, holds):
        self.holds, self.requeued = set(holds), []

    def queued_command_keys(self):
        return self.holds

    def requeue(self, command):
        self.requeued.append(command.id)


def _command(key, status, age_seconds):
    made = now() - timedelta(seconds=age_seconds)
    Command.create(id=key, kind="process_source", target=f"source:{key}", status=status, created=made, updated=made)


def test_only_old_new_commands_the_queue_lacks_are_queued_again(tmp_path):
    open_database(f"sqlite:///{tmp_path / 'notebook.db'}", pool=False)
    try:
        _command("lost2", "new", 60)
        _command("lost1", "new", 90)
        _command("held", "new", 90)  # still in the queue
        _command("fresh", "new", 1)  # committed, about to be queued
        _command("running", "running", 90)
        _command("done", "completed", 90)
        queue = RecordingQueue(holds={"held"})
        assert requeue_lost(queue, older_than=10) == 2
        assert queue.requeued == ["lost1", "lost2"]  # oldest first, as they were queued
        nothing_waits = RecordingQueue(holds=set())
        Command.update(status="completed").where(Command.status == "new").execute()
        assert requeue_lost(nothing_waits, older_than=10) == 0 and nothing_waits.requeued == []
    finally:
        database.close()
