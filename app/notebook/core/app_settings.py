"""The notebook-wide settings, one row of the `setting` table each (a name and its
JSON value; a write is one upsert per name, so two writers of different settings
never undo each other).

Open Notebook's application settings (GET/PUT /settings): two of them change what the notebook does:
`default_embedding_option` (a source added without `embed`: "never" adds it
unembedded, "ask" and "always" embedded; Open Notebook's UI reads it to fill its
add-source form) and `auto_delete_files` (an uploaded file is dropped once
processed). The others are kept and answered but change nothing here (one text
extractor, no Docling, no YouTube transcripts): STORED_ONLY."""

from collections.abc import Iterable
from typing import Any, cast

from app.notebook.core.models import Setting

DEFAULTS: dict[str, Any] = {
    "default_content_processing_engine_doc": "auto",
    "default_content_processing_engine_url": "auto",
    "default_embedding_option": "ask",
    # Open Notebook's default is "yes"; ours keeps the file (GET /sources/{id}/download).
    "auto_delete_files": "no",
    "docling_ocr": True,
    "docling_formulas": False,
    "docling_vision": False,
    "youtube_preferred_languages": ["en", "pt", "es", "de", "nl", "en-GB", "fr", "hi", "ja"],
}
STORED_ONLY = (
    "default_content_processing_engine_doc",
    "default_content_processing_engine_url",
    "docling_ocr",
    "docling_formulas",
    "docling_vision",
    "youtube_preferred_languages",
)


def stored(names: list[str]) -> dict[str, Any]:
    """The values stored under `names` (a name never set is absent)."""
    query = Setting.select(Setting.key, Setting.value).where(Setting.key.in_(names)).tuples()
    return dict(cast(Iterable[tuple[str, Any]], query))  # peewee's stubs type no tuples()


def put(changes: dict[str, Any]) -> None:
    """Store each of `changes` under its name (inside a write transaction)."""
    for name, value in changes.items():
        Setting.insert(key=name, value=value).on_conflict(
            conflict_target=[Setting.key], update={Setting.value: value}
        ).execute()


def current() -> dict[str, Any]:
    """Every one of Open Notebook's settings: the stored value, else its default."""
    values = stored(list(DEFAULTS))
    return {key: values.get(key, default) for key, default in DEFAULTS.items()}


def update(changes: dict[str, Any]) -> dict[str, Any]:
    """Store `changes` (known keys, checked by the route) over the current values
    (call inside a write transaction); every setting after the change."""
    put(changes)
    return current()


def embed_by_default() -> bool:
    """Whether a source added without `embed` is embedded."""
    return current()["default_embedding_option"] != "never"


def auto_delete_files() -> bool:
    return current()["auto_delete_files"] == "yes"
