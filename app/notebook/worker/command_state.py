"""A command's state as its job moves it: made `new` beside what it works on, claimed
`running` by the worker, then `completed`, `failed` or `canceled`. Each change is a
compare-and-set on the status, so a command canceled through the API (or whose
target was deleted) is never completed by a job still at work. Used by the worker's
jobs (processing, podcasts) and by the routes that queue them."""

from app.notebook.core.ids import new_key
from app.notebook.core.models import Command, Source, bump_vectors, now, write_transaction


def new_command(kind, target, request=None):
    """A new command row (call inside the transaction that makes its target).
    `request`: what the job is asked beyond its target, kept as its result until the
    job writes its own (an embedding rebuild's options)."""
    command = Command(
        id=new_key(),
        kind=kind,
        target=target,
        status="new",
        progress={"stage": "queued", "percent": 0},
        result=request,
    )
    command.save(force_insert=True)
    return command


class Canceled(Exception):
    """The command was canceled, or what it works on was deleted."""


def claim(command_key):
    claimed = (
        Command.update(status="running", updated=now(), progress={"stage": "starting", "percent": 0})
        .where((Command.id == command_key) & (Command.status == "new"))
        .execute()
    )
    return Command.get_by_id(command_key) if claimed else None


def ensure_running(command):
    status = Command.select(Command.status).where(Command.id == command.id).scalar()
    if status != "running":
        raise Canceled(f"command {command.id} is {status or 'gone'}")


def progress(command, stage, percent):
    (
        Command.update(progress={"stage": stage, "percent": percent}, updated=now())
        .where((Command.id == command.id) & (Command.status == "running"))
        .execute()
    )
    ensure_running(command)


def complete(command, result, vectors_changed=True):
    """Inside the job's final transaction: only a command still running completes."""
    if vectors_changed:
        bump_vectors()
    done = (
        Command.update(status="completed", result=result, progress={"stage": "done", "percent": 100}, updated=now())
        .where((Command.id == command.id) & (Command.status == "running"))
        .execute()
    )
    if not done:
        raise Canceled(f"command {command.id} was canceled before it could complete")


def fail(command, message: str, status: int | None = None) -> None:
    """`status`: the HTTP status the failure stands for (413: over a cap), kept as the
    command's result {"status": …} for the route that waits on it."""
    with write_transaction():
        failed = (
            Command.update(
                status="failed", error_message=message, updated=now(), result={"status": status} if status else None
            )
            .where((Command.id == command.id) & (Command.status == "running"))
            .execute()
        )
        if failed and command.kind == "process_source":
            (
                Source.update(status="failed", error_message=message, updated=now())
                .where(Source.command_id == command.id)
                .execute()
            )


def fail_unqueued(command, message):
    """A command the queue did not take (its storage did not answer): `failed`, not left
    `new` with no job to run it; a source it processes is failed too (retry it)."""
    with write_transaction():
        failed = (
            Command.update(status="failed", error_message=message, updated=now())
            .where((Command.id == command.id) & (Command.status == "new"))
            .execute()
        )
        if failed and command.kind == "process_source":
            (
                Source.update(status="failed", error_message=message, updated=now())
                .where((Source.command_id == command.id) & (Source.status == "new"))
                .execute()
            )


def stop(command, reason):
    """A command stopped because what it works on went away is `canceled`, not left
    `running` (one canceled through the API is already; this changes nothing then)."""
    with write_transaction():
        (
            Command.update(status="canceled", error_message=reason, updated=now())
            .where((Command.id == command.id) & (Command.status == "running"))
            .execute()
        )
