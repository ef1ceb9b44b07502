"""Open Notebook's application settings (GET/PUT /settings), one row of the
`app_settings` table. Two of them change what the notebook does:
`default_embedding_option` (a source added without `embed`: "never" adds it
unembedded, "ask" and "always" embedded; Open Notebook's UI reads it to fill its
add-source form) and `auto_delete_files` (an uploaded file is dropped once
processed). The others are kept and answered but change nothing here (one text
extractor, no Docling, no YouTube transcripts): STORED_ONLY."""

from typing import Any

from app.notebook.core.models import AppSettings, now

ROW = 1
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


def current() -> dict[str, Any]:
    """Every setting: the stored value, else its default."""
    row = AppSettings.get_or_none(AppSettings.id == ROW)
    stored = row.values if row is not None else {}
    return {key: stored.get(key, default) for key, default in DEFAULTS.items()}


def update(changes: dict[str, Any]) -> dict[str, Any]:
    """Store `changes` (known keys, checked by the route) over the current values
    (call inside a write transaction); every setting after the change."""
    row = AppSettings.get_or_none(AppSettings.id == ROW)
    values = {**(row.values if row is not None else {}), **changes}
    if row is None:
        AppSettings.create(id=ROW, values=values, updated=now())
    else:
        AppSettings.update(values=values, updated=now()).where(AppSettings.id == ROW).execute()
    return current()


def embed_by_default() -> bool:
    """Whether a source added without `embed` is embedded."""
    return current()["default_embedding_option"] != "never"


def auto_delete_files() -> bool:
    return current()["auto_delete_files"] == "yes"
