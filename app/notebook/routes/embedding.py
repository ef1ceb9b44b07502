"""Embedding on demand, as Open Notebook's clients ask for it: one source or note
(POST /embed), and the rebuild of every vector the configured model did not make
(POST /embeddings/rebuild, its status; onb-mcp's POST /rebuild, limited to a
notebook). The job worker embeds; the rebuild is the job `python -m app.notebook
reembed` queues too."""

from typing import Any

from flask import Blueprint

from app.common.failures import ApiError, Invalid, NotFound
from app.notebook.core import embeddings, reembed
from app.notebook.core.ids import key_of, public
from app.notebook.core.models import Command, Source, write_transaction
from app.notebook.core.records import get_source
from app.notebook.routes.http import body, enqueue, jobs, settings
from app.notebook.routes.notebooks import get_notebook
from app.notebook.routes.notes import get_note
from app.notebook.routes.payloads import EmbedRequest, RebuildRequest
from app.notebook.routes.serializers import timestamp
from app.notebook.routes.sources import wait_finished

bp = Blueprint("embedding", __name__)

# Our command statuses as Open Notebook's rebuild status names them (its UI polls
# until completed or failed: a canceled rebuild is failed, with its reason).
_REBUILD_STATUS = {"new": "queued", "running": "running", "completed": "completed", "failed": "failed"}


def _embedding_model() -> str:
    """The configured model's name; 400 saying why when none can be used."""
    reason = embeddings.unavailable_reason(settings())
    if reason:
        raise Invalid(f"no embedding model can be used: {reason}")
    try:
        return reembed.model_name(settings())
    except embeddings.EmbeddingUnavailable as exc:
        raise Invalid(str(exc)) from None


# --------------------------------------------------------------------------- one item


def _embed_command(item_type: str, item_id: str) -> tuple[str, Command]:
    """(public id, its embed command) for the item, made in one transaction."""
    with write_transaction():
        if item_type == "note":
            key = get_note(item_id).id
            return public("note", key), jobs().new_command("embed_note", public("note", key))
        source = get_source(item_id, [Source.id, Source.status])
        if source.status != "completed":
            raise Invalid(f"item_id: only a processed source can be embedded; this one is {source.status}")
        # Embedded from now on: a retry processes it with its vectors.
        Source.update(embed=True).where(Source.id == source.id).execute()
        return public("source", source.id), jobs().new_command("embed_source", public("source", source.id))


@bp.post("/embed")
def embed_item():
    """Embed a source's chunks or a note with the configured model (what it already embedded is kept); waits for the
    job unless `async_processing` (then, or past the wait, 202 with the command to poll)."""
    data = body(EmbedRequest())
    _embedding_model()
    item_id, command = _embed_command(data["item_type"], data["item_id"])
    answer = {"success": True, "item_id": item_id, "item_type": data["item_type"]}
    queued = {
        **answer,
        "message": "Embedding queued for background processing",
        "command_id": public("command", command.id),
    }
    enqueue(command)
    if data["async_processing"]:
        return queued, 202
    status = wait_finished(command.id, settings().sync_timeout)
    if status == "completed":
        done = Command.get_by_id(command.id).result or {}
        count = f" ({done['embedded_chunks']} chunk(s))" if "embedded_chunks" in done else ""
        return {**answer, "message": f"{data['item_type'].capitalize()} embedded{count}", "command_id": None}
    if status in ("failed", "canceled"):
        failed = Command.get_by_id(command.id)
        raise ApiError(400 if status == "failed" else 409, f"the embedding failed: {failed.error_message or status}")
    return queued, 202


# --------------------------------------------------------------------------- rebuild


def _start_rebuild(default_mode: str) -> dict[str, Any]:
    data = body(RebuildRequest())
    notebook_key = get_notebook(data["notebook_id"]).id if data.get("notebook_id") else None
    name = _embedding_model()
    mode = data.get("mode", default_mode)
    asked = reembed.request(mode, data["include_sources"], data["include_notes"])
    sources, notes = reembed.stale_items(name, mode, data["include_sources"], data["include_notes"], notebook_key)
    with write_transaction():
        command = jobs().new_command(reembed.KIND, reembed.target(notebook_key), asked)
    enqueue(command)
    total = len(sources) + len(notes)
    return {
        "command_id": public("command", command.id),
        "total_items": total,
        "estimated_items": total,
        "message": f"Rebuild operation started. Estimated {total} items to process "
        f"({len(sources)} source(s), {len(notes)} note(s)) with {name}.",
    }


@bp.post("/embeddings/rebuild")
def start_rebuild():
    """Queue an embedding rebuild: `existing` re-embeds what has vectors of another model, `all` also what has none
    (insights have no vectors here: include_insights is taken and ignored)."""
    return _start_rebuild("existing")


@bp.post("/rebuild")
def start_notebook_rebuild():
    """onb-mcp's rebuild ({notebook_id}): the embedding rebuild of that notebook's sources and notes (mode `all`
    unless given). Open Notebook itself has no such route."""
    return _start_rebuild("all")


@bp.get("/embeddings/rebuild/<command_id>/status")
def rebuild_status(command_id):
    """A rebuild's status, progress (processed, total, percentage) and counts (sources, notes, insights, failed)."""
    record = Command.get_or_none(Command.id == key_of("command", command_id))
    if record is None or record.kind != reembed.KIND:
        raise NotFound(f"rebuild {command_id[:80]!r} not found")
    counts = record.result if record.status == "completed" else record.progress
    counts = counts if isinstance(counts, dict) and "total" in counts else None
    finished = record.status in ("completed", "failed", "canceled")
    return {
        "command_id": public("command", record.id),
        "status": _REBUILD_STATUS.get(record.status, "failed"),
        "progress": (
            {
                "processed": counts["processed"],
                "total": counts["total"],
                "percentage": round(100 * counts["processed"] / counts["total"], 2) if counts["total"] else 100.0,
            }
            if counts
            else None
        ),
        "stats": (
            {"sources": counts["sources"], "notes": counts["notes"], "insights": 0, "failed": counts["failed"]}
            if counts
            else None
        ),
        "started_at": timestamp(record.created),
        "completed_at": timestamp(record.updated) if finished else None,
        "error_message": record.error_message if record.status in ("failed", "canceled") else None,
    }
