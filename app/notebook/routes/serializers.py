"""Records as the API shows them (the shapes of the response schemas)."""

import json

from peewee import fn

from app.notebook.core import podcast_profiles
from app.notebook.core.ids import public
from app.notebook.core.models import Chunk, Insight, Note, SourceNotebook


def timestamp(value):
    return value.isoformat(timespec="seconds") + "Z" if value else None


def notebook(record, source_count=None, note_count=None):
    if source_count is None:
        source_count = SourceNotebook.select().where(SourceNotebook.notebook == record.id).count()
    if note_count is None:
        note_count = Note.select().where(Note.notebook == record.id).count()
    return {
        "id": public("notebook", record.id),
        "name": record.name,
        "description": record.description,
        "archived": record.archived,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
        "source_count": source_count,
        "note_count": note_count,
    }


def notebook_counts(keys):
    """({notebook key: sources}, {notebook key: notes}) in two grouped queries."""
    sources = dict(
        SourceNotebook.select(SourceNotebook.notebook, fn.COUNT(SourceNotebook.id))
        .where(SourceNotebook.notebook.in_(keys))
        .group_by(SourceNotebook.notebook)
        .tuples()
    )
    notes = dict(
        Note.select(Note.notebook, fn.COUNT(Note.id)).where(Note.notebook.in_(keys)).group_by(Note.notebook).tuples()
    )
    return sources, notes


def source_extras(keys):
    """({source key: [notebook ids]}, {source key: embedded chunk count})."""
    links = {}
    for source_key, notebook_key in (
        SourceNotebook.select(SourceNotebook.source, SourceNotebook.notebook)
        .where(SourceNotebook.source.in_(keys))
        .tuples()
    ):
        links.setdefault(source_key, []).append(public("notebook", notebook_key))
    embedded = dict(
        Chunk.select(Chunk.source, fn.COUNT(Chunk.id))
        .where(Chunk.source.in_(keys) & Chunk.embedding.is_null(False))
        .group_by(Chunk.source)
        .tuples()
    )
    return links, embedded


def asset(record):
    """Where a source came from: the uploaded file's name or the link; null for a text.
    (`file_path` is the field Open Notebook's clients read; `file_name` the same.)"""
    if record.kind == "text":
        return None
    name = record.original_name if record.kind == "upload" else None
    return {"file_path": name, "file_name": name, "url": record.url}


def source(record, links=None, embedded=None, file_available=None, detail=False):
    if links is None or embedded is None:
        links, embedded = source_extras([record.id])
    count = embedded.get(record.id, 0)
    body = {
        "id": public("source", record.id),
        "title": record.title,
        "type": record.kind,
        "topics": list(record.topics or []),
        "asset": asset(record),
        "status": record.status,
        "command_id": public("command", record.command_id),
        "error_message": record.error_message,
        "embedded": count > 0,
        "embedded_chunks": count,
        "insights_count": Insight.select().where(Insight.source == record.id).count(),
        "notebooks": sorted(links.get(record.id, [])),
        "file_available": bool(record.file_name) if file_available is None else file_available,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }
    if detail:
        body["full_text"] = record.full_text
        body["chunk_count"] = Chunk.select().where(Chunk.source == record.id).count()
    return body


def note(record):
    return {
        "id": public("note", record.id),
        "title": record.title,
        "content": record.content,
        "note_type": record.note_type,
        "notebook_id": public("notebook", record.notebook_id),
        "embedded": record.embedding_model is not None,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }


def command(record):
    return {
        "id": public("command", record.id),
        "job_id": public("command", record.id),  # Open Notebook's name (its /commands/jobs/{id})
        "type": record.kind,
        "target": record.target,
        "status": record.status,
        "progress": record.progress,
        "result": record.result,
        "error_message": record.error_message,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }


def credential(record, decryption_error, model_count):
    return {
        "id": public("credential", record.id),
        "name": record.name,
        "provider": record.provider,
        "base_url": record.base_url,
        "modalities": json.loads(record.modalities or "[]"),
        "num_ctx": record.num_ctx,
        "has_api_key": bool(record.api_key_encrypted),
        "decryption_error": decryption_error,
        "model_count": model_count,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }


def model(record):
    return {
        "id": public("model", record.id),
        "name": record.name,
        "provider": record.provider,
        "type": record.type,
        "credential": public("credential", record.credential_id),
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }


def transformation(record):
    return {
        "id": public("transformation", record.id),
        "name": record.name,
        "title": record.title,
        "description": record.description,
        "prompt": record.prompt,
        "apply_default": record.apply_default,
        "model_id": public("model", record.model_id),
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }


def insight(record):
    return {
        "id": public("insight", record.id),
        "source_id": public("source", record.source_id),
        "transformation_id": public("transformation", record.transformation_id),
        "insight_type": record.insight_type,
        "content": record.content,
        "model": record.model_name,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }


def chat_message(record):
    return {
        "id": public("chat_message", str(record.id)),
        "type": record.role,
        "content": record.content,
        "timestamp": timestamp(record.created),
    }


def chat_session(record, message_count, messages=None):
    body = {
        "id": public("chat_session", record.id),
        "title": record.title,
        "notebook_id": public("notebook", record.notebook_id),
        "source_id": public("source", record.source_id),
        "model_override": public("model", record.model_override),
        "message_count": message_count,
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }
    if messages is not None:
        body["messages"] = [chat_message(m) for m in messages]
    return body


# An episode's job in Open Notebook's words, which its web UI's podcasts page knows
# (any other makes the page fail): queued is "submitted", canceled "failed". The job's
# own status is at GET /commands/{command_id}.
EPISODE_STATUSES = {"new": "submitted", "canceled": "failed"}


def episode(record, models: podcast_profiles.Models, command_status=None, error_message=None):
    """An episode with Open Notebook's fields beside ours: the profiles it was made
    with (as they read now: they are built in), its audio's path, its job's error."""
    episode_id = public("episode", record.id)
    return {
        "id": episode_id,
        "name": record.name,
        "notebook_id": public("notebook", record.notebook_id),
        "speakers": record.speakers,
        "length": record.length,
        "command_id": public("command", record.command_id),
        "job_status": EPISODE_STATUSES.get(command_status, command_status),
        "error_message": error_message,
        "transcript": record.transcript,
        "audio_available": bool(record.audio_file),
        "audio_url": f"/api/podcasts/episodes/{episode_id}/audio" if record.audio_file else None,
        "briefing": record.briefing or "",
        "episode_profile": podcast_profiles.episode_profile(record.length, models),
        "speaker_profile": podcast_profiles.speaker_profile(record.speakers, models),
        "created": timestamp(record.created),
        "updated": timestamp(record.updated),
    }
