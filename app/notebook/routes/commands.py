"""Commands: the background jobs, polled by clients (no push)."""

from flask import Blueprint

from app.common.failures import Conflict, NotFound
from app.notebook.core.ids import key_of
from app.notebook.core.models import Command, Source, now
from app.notebook.routes import serializers
from app.notebook.routes.http import query
from app.notebook.routes.payloads import CommandListQuery

bp = Blueprint("commands", __name__)

FINISHED = ("completed", "failed", "canceled")


def get_command(public_id):
    record = Command.get_or_none(Command.id == key_of("command", public_id))
    if record is None:
        raise NotFound(f"command {public_id[:80]!r} not found")
    return record


@bp.get("/commands")
def list_commands():
    """The background jobs (commands), newest first, optionally of one status, a page at a time."""
    args = query(CommandListQuery)
    selection = Command.select()
    if args.get("status"):
        selection = selection.where(Command.status == args["status"])
    total = selection.count()
    page = selection.order_by(Command.created.desc(), Command.id).limit(args["limit"]).offset(args["offset"])
    return {"commands": [serializers.command(c) for c in page], "total_count": total}


@bp.get("/commands/<command_id>")
@bp.get("/commands/jobs/<command_id>")  # Open Notebook's path; the same answer
@bp.get("/podcasts/jobs/<command_id>")  # Open Notebook's path for a podcast's job (onb-mcp)
def read_command(command_id):
    """One background job: its status, progress and result."""
    return serializers.command(get_command(command_id))


@bp.delete("/commands/<command_id>")
def cancel_command(command_id):
    """Cancel a job that has not finished: a queued one is skipped by the worker, a
    running one stops at its next step. A finished one cannot be canceled (409)."""
    record = get_command(command_id)
    updated = (
        Command.update(status="canceled", error_message="canceled by request", updated=now())
        .where((Command.id == record.id) & Command.status.in_(("new", "running")))
        .execute()
    )
    if not updated:
        current = Command.get_by_id(record.id)
        raise Conflict(f"the command has already finished ({current.status})")
    if record.kind == "process_source":
        (
            Source.update(status="canceled", error_message="processing was canceled", updated=now())
            .where((Source.command_id == record.id) & Source.status.in_(("new", "running")))
            .execute()
        )
    return serializers.command(Command.get_by_id(record.id))
