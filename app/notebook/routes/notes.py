"""Notes: written by people (`human`) or saved from AI answers (`ai`). A note is
indexed for text search at once and embedded by the worker for vector search."""

from flask import Blueprint

from app.common.failures import NotFound
from app.notebook.core import cleanup, index
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import Note, bump_vectors, now, write_transaction
from app.notebook.routes import serializers
from app.notebook.routes.http import body, check_text, jobs, query
from app.notebook.routes.notebooks import get_notebook
from app.notebook.routes.payloads import NoteCreate, NoteListQuery, NoteUpdate

bp = Blueprint("notes", __name__)


def get_note(public_id):
    record = Note.get_or_none(Note.id == key_of("note", public_id))
    if record is None:
        raise NotFound(f"note {public_id[:80]!r} not found")
    return record


def default_title(content):
    """The first non-blank line, shortened: a title the list can show."""
    line = next((text.strip() for text in content.splitlines() if text.strip()), "Untitled note")
    return line if len(line) <= 80 else line[:79].rstrip() + "…"


def _reindex(record):
    target = public("note", record.id)
    index.put(target, record.title, record.content)
    record.embedding = record.embedding_model = record.embedding_dim = None
    bump_vectors()


@bp.get("/notes")
def list_notes():
    """The notes, optionally of one notebook, most recently updated first."""
    args = query(NoteListQuery)
    selection = Note.select(
        Note.id,
        Note.title,
        Note.content,
        Note.note_type,
        Note.notebook,
        Note.embedding_model,
        Note.created,
        Note.updated,
    ).order_by(Note.updated.desc())
    if args.get("notebook_id"):
        selection = selection.where(Note.notebook == get_notebook(args["notebook_id"]).id)
    return [serializers.note(n) for n in selection]


@bp.post("/notes")
def create_note():
    """Write a note, optionally in a notebook; untitled, it is titled from its content (201)."""
    data = body(NoteCreate())
    check_text("content", data["content"])
    notebook_key = get_notebook(data["notebook_id"]).id if data.get("notebook_id") else None
    with write_transaction():
        record = Note(
            id=new_key(),
            title=data.get("title") or default_title(data["content"]),
            content=data["content"],
            note_type=data["note_type"],
            notebook=notebook_key,
        )
        record.save(force_insert=True)
        _reindex(record)
        command = jobs().note_command(record)
    jobs().enqueue(command)  # after the commit: the worker must see the note
    return serializers.note(record), 201


@bp.get("/notes/<note_id>")
def read_note(note_id):
    """One note."""
    return serializers.note(get_note(note_id))


@bp.put("/notes/<note_id>")
def update_note(note_id):
    """Change a note's title, content or type."""
    record = get_note(note_id)
    data = body(NoteUpdate())
    check_text("content", data.get("content"))
    for field in ("title", "content", "note_type"):
        if field in data:
            setattr(record, field, data[field])
    if not record.title:
        record.title = default_title(record.content)
    record.updated = now()
    with write_transaction():
        _reindex(record)
        record.save()
        command = jobs().note_command(record)
    jobs().enqueue(command)
    return serializers.note(record)


@bp.delete("/notes/<note_id>")
def delete_note(note_id):
    """Delete a note and its embeddings."""
    record = get_note(note_id)
    with write_transaction():
        cleanup.delete_note(record)
    return {"deleted": public("note", record.id)}
