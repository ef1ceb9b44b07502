"""Notebooks: list, create, read, update, delete; the sources linked to one (add an
existing source, remove it); what a delete would do; the notebooks and sources viewed
last; a notebook's context as Open Notebook's Python client asks for it."""

import logging
from typing import Any

from flask import Blueprint
from peewee import fn

from app.common.failures import NotFound
from app.notebook.core import cleanup
from app.notebook.core.context import build_context, checked_config, sizes
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Note, Notebook, Source, SourceNotebook, now, write_transaction
from app.notebook.core.records import get_source
from app.notebook.routes import serializers
from app.notebook.routes.http import body, query, settings
from app.notebook.routes.payloads import (
    NotebookContextRequest,
    NotebookCreate,
    NotebookDeleteQuery,
    NotebookListQuery,
    NotebookUpdate,
    RecentlyViewedQuery,
)

log = logging.getLogger("bundle.notebook")
bp = Blueprint("notebooks", __name__)

_ORDER = {"updated": Notebook.updated, "created": Notebook.created, "name": Notebook.name_key}


def get_notebook(public_id):
    record = Notebook.get_or_none(Notebook.id == key_of("notebook", public_id))
    if record is None:
        raise NotFound(f"notebook {public_id[:80]!r} not found")
    return record


def stamp_view(model: Any, key: str) -> None:
    """Record that a notebook or a source was viewed (/recently-viewed), as Open
    Notebook does on reading one. Best effort: a read never fails for it. One UPDATE
    that reads nothing first, so no write transaction: a read does not take the
    service-wide write lock (write_transaction's) and queue behind every writer."""
    try:
        model.update(last_viewed_at=now()).where(model.id == key).execute()
    except Exception as exc:  # the database's error, whichever database
        log.warning("could not record the view of %s %s: %s", model.__name__.lower(), key, exc)


@bp.get("/notebooks")
def list_notebooks():
    """The notebooks, with their source and note counts, in the order asked, optionally archived or not."""
    args = query(NotebookListQuery)
    field, *direction = args["order_by"].lower().split()
    order = _ORDER[field].desc() if direction == ["desc"] else _ORDER[field].asc()
    selection = Notebook.select().order_by(order, Notebook.id)  # names may repeat: the id breaks ties
    if "archived" in args:
        selection = selection.where(Notebook.archived == args["archived"])
    records = list(selection)
    sources, notes = serializers.notebook_counts([r.id for r in records])
    return [serializers.notebook(r, sources.get(r.id, 0), notes.get(r.id, 0)) for r in records]


@bp.post("/notebooks")
def create_notebook():
    """Create a notebook (201); two notebooks may share a name, as in Open Notebook."""
    data = body(NotebookCreate())
    record = Notebook.create(
        id=new_key(), name=data["name"], name_key=data["name"].casefold(), description=data["description"]
    )
    return serializers.notebook(record, 0, 0), 201


@bp.get("/notebooks/<notebook_id>")
def read_notebook(notebook_id):
    """One notebook with its source and note counts; the view is recorded (/recently-viewed)."""
    record = get_notebook(notebook_id)
    stamp_view(Notebook, record.id)
    return serializers.notebook(record)


@bp.put("/notebooks/<notebook_id>")
def update_notebook(notebook_id):
    """Rename, describe, archive or unarchive a notebook (an empty body changes nothing)."""
    record = get_notebook(notebook_id)
    data = body(NotebookUpdate())
    if not data:
        return serializers.notebook(record)
    if "name" in data:
        record.name, record.name_key = data["name"], data["name"].casefold()
    for field in ("description", "archived"):
        if field in data:
            setattr(record, field, data[field])
    record.updated = now()
    record.save()
    return serializers.notebook(record)


@bp.delete("/notebooks/<notebook_id>")
def delete_notebook(notebook_id):
    """Its notes go. Sources only it holds are kept (in no notebook) unless the caller
    asks to delete them (`delete_exclusive_sources=true`); shared ones are unlinked.
    The answer says what happened to each."""
    args = query(NotebookDeleteQuery)
    record = get_notebook(notebook_id)
    with write_transaction():
        removed = cleanup.delete_notebook(record, settings().uploads_dir, args["delete_exclusive_sources"])
    cleanup.remove_files(removed.pop("files"))
    kept = removed["kept_sources"]
    message = (
        f"Notebook deleted; {removed['deleted_notes']} note(s) and {removed['deleted_sources']} "
        f"source(s) deleted, {removed['unlinked_sources']} shared source(s) unlinked"
        + (f", {kept} source(s) that only it held kept (delete_exclusive_sources=true deletes them)" if kept else "")
    )
    return {"message": message, "deleted": public("notebook", record.id), **removed}


def _source_counts(notebook_key: str) -> tuple[int, int]:
    """(sources only this notebook holds, sources it shares with another)."""
    linked = SourceNotebook.select(SourceNotebook.source).where(SourceNotebook.notebook == notebook_key)
    rows: Any = (  # (source key, how many notebooks hold it)
        SourceNotebook.select(SourceNotebook.source, fn.COUNT(SourceNotebook.notebook))
        .where(SourceNotebook.source.in_(linked))
        .group_by(SourceNotebook.source)
    )
    holders = [count for _, count in rows.tuples()]
    return sum(1 for n in holders if n == 1), sum(1 for n in holders if n > 1)


@bp.get("/notebooks/<notebook_id>/delete-preview")
def delete_preview(notebook_id):
    """What deleting the notebook would do: its notes go, the sources only it holds go when asked
    (`delete_exclusive_sources=true`), the shared ones are unlinked."""
    record = get_notebook(notebook_id)
    exclusive, shared = _source_counts(record.id)
    return {
        "notebook_id": public("notebook", record.id),
        "notebook_name": record.name,
        "note_count": Note.select().where(Note.notebook == record.id).count(),
        "exclusive_source_count": exclusive,
        "shared_source_count": shared,
    }


@bp.post("/notebooks/<notebook_id>/sources/<source_id>")
def add_source(notebook_id, source_id):
    """Add an existing source to the notebook; adding it again changes nothing (200 both times)."""
    with write_transaction():  # both looked up in it: neither can go before the link is made
        notebook = get_notebook(notebook_id)
        source = get_source(source_id, [Source.id])
        SourceNotebook.insert(source=source.id, notebook=notebook.id).on_conflict_ignore().execute()
    return _link_answer("Source linked to notebook successfully", notebook.id, source.id)


@bp.delete("/notebooks/<notebook_id>/sources/<source_id>")
def remove_source(notebook_id, source_id):
    """Remove a source from the notebook; the source itself stays (in its other notebooks, or in none).
    Removing one the notebook does not hold changes nothing."""
    with write_transaction():
        notebook = get_notebook(notebook_id)
        source = get_source(source_id, [Source.id])
        SourceNotebook.delete().where(
            (SourceNotebook.notebook == notebook.id) & (SourceNotebook.source == source.id)
        ).execute()
    return _link_answer("Source removed from notebook successfully", notebook.id, source.id)


def _link_answer(message: str, notebook_key: str, source_key: str) -> dict:
    return {
        "message": message,
        "notebook_id": public("notebook", notebook_key),
        "source_id": public("source", source_key),
    }


def _recent(model: Any, title, kind: str, limit: int) -> list[dict]:
    rows = (
        model.select(model.id, title.alias("title"), model.last_viewed_at)
        .where(model.last_viewed_at.is_null(False))
        .order_by(model.last_viewed_at.desc(), model.id)
        .limit(limit)
    )
    return [
        {
            "type": kind,
            "id": public(kind, row.id),
            "title": row.title or f"Untitled {kind}",
            "last_viewed_at": row.last_viewed_at.isoformat(timespec="microseconds") + "Z",
        }
        for row in rows
    ]


@bp.get("/recently-viewed")
def recently_viewed():
    """The notebooks and sources read last (GET /notebooks/{id}, GET /sources/{id}), newest first."""
    limit = query(RecentlyViewedQuery)["limit"]
    items = _recent(Notebook, Notebook.name, "notebook", limit) + _recent(Source, Source.title, "source", limit)
    # ISO timestamps of one format sort as text.
    return sorted(items, key=lambda item: item["last_viewed_at"], reverse=True)[:limit]


@bp.post("/notebooks/<notebook_id>/context")
def notebook_context(notebook_id):
    """A notebook's context in Open Notebook's shape ({notebook_id, sources, notes, total_tokens}): the same
    context as /chat/context/build (an item the config does not name is included in full)."""
    data = body(NotebookContextRequest())
    record = get_notebook(notebook_id)
    config = checked_config(data.get("context_config"))
    context = build_context(record.id, config, settings().context_max_chars)
    counted = sizes(context)
    return {
        "notebook_id": public("notebook", record.id),
        "sources": context["sources"],
        "notes": context["notes"],
        "total_tokens": counted["token_count"],
        "char_count": counted["char_count"],
    }
