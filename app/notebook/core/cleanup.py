"""Deleting records with everything that hangs on them: chunks, index rows,
unfinished jobs (canceled, so the worker skips them) and uploaded files."""

import logging
import os

from app.notebook.core import index
from app.notebook.core.ids import public
from app.notebook.core.models import ChatSession, Command, Note, Source, SourceNotebook, bump_vectors, now

log = logging.getLogger("bundle.notebook")
UNFINISHED = ("new", "running")


def cancel_commands(target, reason):
    """Mark the unfinished commands of `target` canceled; the worker checks before
    it starts a job and between its steps, and never overwrites a canceled one.
    Returns the ids canceled."""
    keys = [c.id for c in Command.select(Command.id).where((Command.target == target) & Command.status.in_(UNFINISHED))]
    if keys:
        (
            Command.update(status="canceled", error_message=reason, updated=now())
            .where(Command.id.in_(keys) & Command.status.in_(UNFINISHED))
            .execute()
        )
    return [public("command", k) for k in keys]


def delete_source(record, uploads_dir):
    """Delete a source (its chunks and links go by cascade); returns (chunk count,
    canceled command ids, the file to remove or None). Call inside a transaction,
    remove the file after it commits."""
    target = public("source", record.id)
    canceled = cancel_commands(target, "canceled: the source was deleted")
    chunks = record.chunks.count()
    index.drop(target)
    bump_vectors()
    record.delete_instance(recursive=False)  # chunks and links: ON DELETE CASCADE
    path = os.path.join(uploads_dir, record.file_name) if record.file_name else None
    return chunks, canceled, path


def delete_note(record):
    target = public("note", record.id)
    cancel_commands(target, "canceled: the note was deleted")
    index.drop(target)
    bump_vectors()
    record.delete_instance()


def delete_notebook(record, uploads, delete_exclusive_sources):
    """Notes of the notebook go; sources shared with other notebooks are unlinked and
    stay; sources only in this notebook go when `delete_exclusive_sources`, else they
    stay in no notebook. Returns the counts and the files to remove once the
    transaction commits."""
    notes = list(Note.select(Note.id).where(Note.notebook == record.id))
    for note in notes:
        delete_note(note)
    deleted, unlinked, kept, files = 0, 0, 0, []
    for link in list(SourceNotebook.select().where(SourceNotebook.notebook == record.id)):
        others = (
            SourceNotebook.select()
            .where((SourceNotebook.source == link.source_id) & (SourceNotebook.notebook != record.id))
            .count()
        )
        if others or not delete_exclusive_sources:
            link.delete_instance()
            unlinked += bool(others)
            kept += not others
        else:
            _, _, path = delete_source(Source.get_by_id(link.source_id), uploads)
            deleted += 1
            if path:
                files.append(path)
    chats = ChatSession.select().where(ChatSession.notebook == record.id).count()  # they go with it (cascade)
    record.delete_instance()
    return {
        "deleted_notes": len(notes),
        "deleted_chat_sessions": chats,
        "deleted_sources": deleted,
        "unlinked_sources": unlinked,
        "kept_sources": kept,
        "files": files,
    }


def remove_files(paths):
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", path, exc)
