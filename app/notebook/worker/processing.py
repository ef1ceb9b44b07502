"""What the job worker does with a command: process a source (extract, chunk,
embed, index) or embed a note.

Status moves by compare-and-set on the command row, so that whoever changes it
first wins: the worker claims `new` -> `running` (a command canceled while queued
is skipped, and the worker goes on with the next job), checks between steps that
it is still `running` (a delete or DELETE /commands stops it), and writes its
result in the same transaction that checks once more. A job that raises is
`failed` with its error, never `completed`."""

import logging
import os
from contextlib import nullcontext
from datetime import timedelta

from app.common.failures import Failure
from app.notebook import llm
from app.notebook.core import embeddings, index, model_choice, reembed, transform
from app.notebook.core.ids import new_key, public
from app.notebook.core.models import (
    Chunk,
    Command,
    Insight,
    InsightRequest,
    Note,
    Source,
    Transformation,
    bump_vectors,
    now,
    write_transaction,
)
from app.notebook.ingest import chunking, extract, ssrf
from app.notebook.worker import episodes
from app.notebook.worker.command_state import (
    Canceled,
    claim,
    complete,
    ensure_running,
    fail,
    new_command,
    progress,
    stop,
)

log = logging.getLogger("bundle.notebook.worker")
_settings = None
_queue = None
EMBED_BATCH = 32


def configure(settings, queue=None):
    """Called once by the worker process before it consumes jobs; `queue` takes the
    jobs that jobs start (a processed source's insights)."""
    global _settings, _queue
    _settings, _queue = settings, queue


def run(command_key):
    """The huey task: run one command to its end (completed, failed or canceled)."""
    presence = _queue.presence if _queue is not None else None
    # Several workers: this one is recorded as the command's holder while it runs it.
    with presence.holding(command_key) if presence else nullcontext():
        _run(command_key)


def _run(command_key):
    command = claim(command_key)
    if command is None:
        log.info("command %s skipped: it is no longer queued", command_key)
        return
    handler = HANDLERS[command.kind]
    try:
        handler(command)
    except Canceled as exc:
        log.info("command %s stopped: %s", command.id, exc)
        stop(command, str(exc))
    except (extract.ExtractionError, ssrf.LinkRefused, embeddings.EmbeddingUnavailable, llm.ProviderError) as exc:
        log.info("command %s failed: %s", command.id, exc)
        # Over a text cap: its 413 is kept, so that a synchronous add answers it.
        fail(command, str(exc), exc.status if isinstance(exc, extract.TooMuchText) else None)
    except Failure as exc:  # what a route would answer: no model configured, an unknown override
        log.info("command %s failed: %s", command.id, exc.message)
        fail(command, exc.message)
    except Exception as exc:  # a bug or an unexpected library error: failed, with its kind, logged
        log.exception("command %s failed unexpectedly", command.id)
        fail(command, f"processing failed: {type(exc).__name__}: {str(exc)[:300]}")


def recover_interrupted(orphaned=None):
    """A command left `running` by a worker that stopped or crashed is failed (retry
    starts it again), not left running forever. `orphaned(keys)`: those of the
    running commands whose worker is gone (presence.Presence.orphaned, when several
    workers share the queue); without it, every running command (at the start of
    the one worker there is)."""
    keys = [c.id for c in Command.select(Command.id).where(Command.status == "running")]
    if orphaned is not None:
        keys = orphaned(keys)
    for key in keys:
        fail(Command.get_by_id(key), "the worker stopped while this job ran; retry it")
    return len(keys)


def requeue_lost(queue, older_than: float):
    """Hand the queue again every `new` command older than `older_than` seconds that it
    no longer holds; their number. Redis replicates asynchronously: an enqueue that the
    old master acknowledged may be missing from the new one after a failover (and a
    Redis that lost its last writes, too). The commands are read before the queue: a
    command taken from the queue meanwhile, not yet claimed, is queued twice, and runs
    once (the second claim finds it no longer `new`). `older_than` leaves alone the
    commands a web worker committed and is about to queue."""
    waiting = _new_commands(created_before=now() - timedelta(seconds=older_than))
    if not waiting:
        return 0
    queued = queue.queued_command_keys()
    lost = [command for command in waiting if command.id not in queued]
    for command in lost:
        queue.requeue(command)
    return len(lost)


def requeue_waiting(queue):
    """At worker start: hand every `new` command to the queue again, so that none is
    lost if a web worker died between its commit and its enqueue. A command queued
    twice runs once: the second claim finds it no longer `new`."""
    waiting = _new_commands()
    for command in waiting:
        queue.requeue(command)
    return len(waiting)


def _new_commands(created_before=None):
    """The commands no worker has claimed yet (`new`), oldest first; only those created
    before `created_before` when given."""
    query = Command.select().where(Command.status == "new")
    if created_before is not None:
        query = query.where(Command.created < created_before)
    return list(query.order_by(Command.created))


# --------------------------------------------------------------------------- sources


def _source_of(command):
    key = command.target.split(":", 1)[1]
    source = Source.get_or_none(Source.id == key)
    if source is None or source.command_id != command.id:
        raise Canceled(f"{command.target} was deleted or is processed by another command")
    return source


def _document(source):
    """(text, title hint) of the source's original, within the text caps."""
    caps = {"max_chars": _settings.max_source_chars, "ratio": _settings.max_expansion}
    if source.kind == "text":
        return extract.extract("text", source.full_text.encode("utf-8"), **caps)
    if source.kind == "link":
        body, content_type, final_url = ssrf.fetch(
            source.url, _settings.url_allowlist, _settings.fetch_timeout, _settings.fetch_max_bytes
        )
        name = final_url.split("?", 1)[0].rsplit("/", 1)[-1]
        kind = extract.detect(name if "." in name else "", body[:4096], content_type or "text/html")
        return extract.extract(kind, body, url=final_url, **caps)
    path = os.path.join(_settings.uploads_dir, source.file_name or "")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise extract.ExtractionError(f"the uploaded file cannot be read: {exc.strerror}") from None
    kind = extract.detect(source.original_name or source.file_name, data[:4096], source.content_type)
    return extract.extract(kind, data, **caps)


def _embed(command, texts):
    """(vectors, model name) or (None, why not) when no model can be used."""
    try:
        model = embeddings.embedder(_settings)
    except embeddings.EmbeddingUnavailable as exc:
        return None, str(exc)
    vectors = []
    for start in range(0, len(texts), EMBED_BATCH):
        vectors.extend(model.embed(texts[start : start + EMBED_BATCH]))
        progress(command, "embedding", 40 + int(50 * min(len(texts), start + EMBED_BATCH) / len(texts)))
    return vectors, model.name


def _fallback_title(source):
    if source.kind == "upload":
        return source.original_name or "Uploaded file"
    if source.kind == "link":
        return source.url[:500]
    return "Text source"


def process_source(command):
    source = _source_of(command)
    # Only from `new`: a cancel that came first keeps the source `canceled`, and the
    # progress check just below then stops the job.
    (
        Source.update(status="running", updated=now())
        .where((Source.id == source.id) & (Source.command_id == command.id) & (Source.status == "new"))
        .execute()
    )
    progress(command, "extracting", 10)
    text, title_hint = _document(source)
    progress(command, "chunking", 30)
    pieces = chunking.chunks(text, _settings.chunk_size, _settings.chunk_overlap)
    vectors, model = _embed(command, pieces) if source.embed and pieces else (None, "not requested")
    embedded = vectors is not None
    title = (source.title or title_hint or _fallback_title(source))[:500]
    target = public("source", source.id)
    with write_transaction():
        ensure_running(command)
        _source_of(command)  # still there, still ours
        Chunk.delete().where(Chunk.source == source.id).execute()
        rows = [
            {
                "source": source.id,
                "ordinal": i,
                "text": piece,
                "embedding": embeddings.to_blob(vectors[i]) if embedded else None,
                "embedding_model": model if embedded else None,
                "embedding_dim": len(vectors[i]) if embedded else None,
            }
            for i, piece in enumerate(pieces)
        ]
        for start in range(0, len(rows), 200):
            Chunk.insert_many(rows[start : start + 200]).execute()
        index.put(target, title, text)
        (
            Source.update(full_text=text, title=title, status="completed", error_message=None, updated=now())
            .where(Source.id == source.id)
            .execute()
        )
        result = {
            "source_id": target,
            "title": title,
            "characters": len(text),
            "chunks": len(pieces),
            "embedded_chunks": len(pieces) if embedded else 0,
            "embedding_model": model if embedded else None,
        }
        if not embedded:
            result["embedding"] = model  # why not: not requested, or no model available
        complete(command, result)
        insight_commands = _queue_requested_insights(source.id)
    if source.delete_file and source.file_name:
        _drop_file(source)
    for queued in insight_commands:
        _queue.enqueue(queued)


def _queue_requested_insights(source_key):
    """Commands for the transformations the source asked for at its creation (in the
    transaction that completes its processing; enqueued after it commits)."""
    commands = []
    for request in InsightRequest.select().where(
        (InsightRequest.source == source_key) & InsightRequest.command_id.is_null()
    ):
        command = new_command("insight", public("source", source_key))
        InsightRequest.update(command_id=command.id).where(InsightRequest.id == request.id).execute()
        commands.append(command)
    return commands


def _drop_file(source):
    try:
        os.unlink(os.path.join(_settings.uploads_dir, source.file_name))
    except OSError:
        pass
    Source.update(file_name=None).where(Source.id == source.id).execute()


def _stale_chunks(source_key, model_name):
    return list(
        Chunk.select(Chunk.id, Chunk.text)
        .where(
            (Chunk.source == source_key) & ((Chunk.embedding_model.is_null()) | (Chunk.embedding_model != model_name))
        )
        .order_by(Chunk.ordinal)
    )


def _store_chunk_vectors(stale, vectors, model_name):
    for chunk, vector in zip(stale, vectors):
        (
            Chunk.update(embedding=embeddings.to_blob(vector), embedding_model=model_name, embedding_dim=len(vector))
            .where(Chunk.id == chunk.id)
            .execute()
        )


def embed_source(command):
    """Re-embed the chunks of a processed source that the configured model did not
    make (the model changed, or it was added without embeddings): no extraction."""
    source = Source.get_or_none(Source.id == command.target.split(":", 1)[1])
    if source is None:
        raise Canceled(f"{command.target} was deleted")
    model = embeddings.embedder(_settings)
    stale = _stale_chunks(source.id, model.name)
    vectors, _ = _embed(command, [chunk.text for chunk in stale]) if stale else ([], model.name)
    with write_transaction():
        ensure_running(command)
        _store_chunk_vectors(stale, vectors, model.name)
        complete(command, {"source_id": command.target, "embedded_chunks": len(stale), "embedding_model": model.name})


# --------------------------------------------------------------------------- embedding rebuild


def rebuild_embeddings(command):
    """Embed, one after the other, the sources and notes whose vectors the configured
    model did not make (core/reembed.py chooses them), counting them in the command's
    progress; an item the model fails on is counted failed and the rebuild goes on
    (all of them failing fails it). Each item's vectors are committed as they come: a
    rebuild canceled half way keeps what it embedded."""
    asked = (command.result or {}).get("request") or {}
    model = embeddings.embedder(_settings)
    notebook_key = command.target.split(":", 1)[1] if command.target.startswith("notebook:") else None
    sources, notes = reembed.stale_items(
        model.name,
        asked.get("mode", "all"),
        asked.get("include_sources", True),
        asked.get("include_notes", True),
        notebook_key,
    )
    counts = {"total": len(sources) + len(notes), "processed": 0, "sources": 0, "notes": 0, "failed": 0}
    last_error = None
    for kind, key in [("sources", k) for k in sources] + [("notes", k) for k in notes]:
        try:
            (_rebuild_source if kind == "sources" else _rebuild_note)(command, key, model)
            counts[kind] += 1
        except (embeddings.EmbeddingUnavailable, llm.ProviderError) as exc:
            counts["failed"] += 1
            last_error = str(exc)
        counts["processed"] += 1
        _rebuild_progress(command, counts)
    if counts["failed"] and counts["failed"] == counts["total"]:
        raise embeddings.EmbeddingUnavailable(f"no item could be embedded: {last_error}")
    with write_transaction():
        ensure_running(command)
        complete(command, {**asked, **counts, "embedding_model": model.name, "last_error": last_error})


def _rebuild_progress(command, counts):
    percent = int(100 * counts["processed"] / counts["total"]) if counts["total"] else 100
    (
        Command.update(progress={"stage": "embedding", "percent": percent, **counts}, updated=now())
        .where((Command.id == command.id) & (Command.status == "running"))
        .execute()
    )
    ensure_running(command)


def _rebuild_source(command, source_key, model):
    stale = _stale_chunks(source_key, model.name)
    vectors = []
    for start in range(0, len(stale), EMBED_BATCH):
        vectors.extend(model.embed([chunk.text for chunk in stale[start : start + EMBED_BATCH]]))
        ensure_running(command)
    with write_transaction():
        ensure_running(command)
        _store_chunk_vectors(stale, vectors, model.name)  # a chunk deleted meanwhile: no row to update
        bump_vectors()


def _rebuild_note(command, note_key, model):
    note = Note.get_or_none(Note.id == note_key)
    if note is None:  # deleted meanwhile: nothing to embed
        return
    vector = model.embed([f"{note.title}\n{note.content}"])[0]
    with write_transaction():
        ensure_running(command)
        _store_note_vector(note, vector, model.name)
        bump_vectors()


def _store_note_vector(note, vector, model_name):
    """Only if the note still says what was embedded (a newer edit has its own command)."""
    (
        Note.update(embedding=embeddings.to_blob(vector), embedding_model=model_name, embedding_dim=len(vector))
        .where((Note.id == note.id) & (Note.content == note.content) & (Note.title == note.title))
        .execute()
    )


# --------------------------------------------------------------------------- notes


def embed_note(command):
    key = command.target.split(":", 1)[1]
    note = Note.get_or_none(Note.id == key)
    if note is None:
        raise Canceled(f"{command.target} was deleted")
    text = f"{note.title}\n{note.content}"
    model = embeddings.embedder(_settings)
    progress(command, "embedding", 30)
    vector = model.embed([text])[0]
    with write_transaction():
        ensure_running(command)
        _store_note_vector(note, vector, model.name)
        complete(command, {"note_id": command.target, "embedding_model": model.name, "dimensions": len(vector)})


# --------------------------------------------------------------------------- insights


def insight(command):
    """Apply a transformation to a source with the language model; store the insight."""
    request = InsightRequest.get_or_none(InsightRequest.command_id == command.id)
    source = Source.get_or_none(Source.id == request.source_id) if request else None
    transformation = Transformation.get_or_none(Transformation.id == request.transformation_id) if request else None
    if source is None or transformation is None:
        raise Canceled(f"the source or the transformation of {command.id} was deleted")
    resolved = model_choice.resolve(
        _settings, "transformation", transform.model_override(transformation, request.model_id)
    )
    progress(command, "asking the model", 20)
    output = llm.chat(
        resolved.target,
        resolved.name,
        transform.messages_for(transformation.prompt, source.full_text, _settings.context_max_chars),
    )
    with write_transaction():
        ensure_running(command)
        record = Insight.create(
            id=new_key(),
            source=source.id,
            transformation=transformation.id,
            insight_type=transformation.title or transformation.name,
            content=output,
            model_name=resolved.name,
        )
        complete(
            command,
            {
                "insight_id": public("insight", record.id),
                "source_id": command.target,
                "transformation_id": public("transformation", transformation.id),
                "model_id": resolved.id,
            },
            vectors_changed=False,
        )


def podcast(command):
    episodes.make_episode(command, _settings)


HANDLERS = {
    "process_source": process_source,
    "embed_source": embed_source,
    "embed_note": embed_note,
    "insight": insight,
    "podcast": podcast,
    "rebuild_embeddings": rebuild_embeddings,
}
