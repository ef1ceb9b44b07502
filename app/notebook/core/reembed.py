"""What an embedding rebuild embeds: the sources and notes whose vectors the configured
embedding model did not make. One selection for the three ways to ask for it (the
command `python -m app.notebook reembed`, POST /embeddings/rebuild and onb-mcp's POST
/rebuild); the job worker runs the rebuild (worker/processing.py)."""

from typing import Any

from peewee import Expression

from app.notebook.core import embeddings
from app.notebook.core.ids import public
from app.notebook.core.models import Chunk, Note, Source, SourceNotebook

MODES = ("existing", "all")
KIND = "rebuild_embeddings"
ALL_TARGET = "embeddings"  # a rebuild's command target: this, or the notebook it is limited to


def model_name(settings: Any) -> str:
    """The name vectors are recorded with: the default embedding model's, else the
    NOTEBOOK_EMBEDDING_* model's (not loaded to learn it). Raises EmbeddingUnavailable."""
    default = embeddings.default_embedder(settings)
    return default.name if default else settings.embedding_model


def _stale(model_field: Any, name: str, mode: str) -> Expression:
    """`existing`: vectors of another model; `all`: those and none at all."""
    other = model_field != name
    return (model_field.is_null(False) & other) if mode == "existing" else (model_field.is_null() | other)


def stale_items(
    name: str, mode: str, sources: bool = True, notes: bool = True, notebook_key: str | None = None
) -> tuple[list[str], list[str]]:
    """(source keys, note keys) to embed with the model `name`: processed sources with
    such chunks, and such notes; only those of `notebook_key` when given."""
    source_keys: list[str] = []
    note_keys: list[str] = []
    if sources:
        chosen = Source.select(Source.id).join(Chunk).where(_stale(Chunk.embedding_model, name, mode))
        chosen = chosen.where(Source.status == "completed")
        if notebook_key:
            linked = SourceNotebook.select(SourceNotebook.source).where(SourceNotebook.notebook == notebook_key)
            chosen = chosen.where(Source.id.in_(linked))
        source_keys = [row.id for row in chosen.distinct().order_by(Source.id)]
    if notes:
        written = Note.select(Note.id).where(_stale(Note.embedding_model, name, mode))
        if notebook_key:
            written = written.where(Note.notebook == notebook_key)
        note_keys = [row.id for row in written.order_by(Note.id)]
    return source_keys, note_keys


def request(mode: str, sources: bool, notes: bool) -> dict[str, Any]:
    """What a rebuild command was asked (kept in its `result` until it has one of its own)."""
    return {"request": {"mode": mode, "include_sources": sources, "include_notes": notes}}


def target(notebook_key: str | None) -> str:
    return public("notebook", notebook_key) if notebook_key else ALL_TARGET
