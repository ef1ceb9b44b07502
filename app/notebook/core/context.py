"""The context a chat, an ask or a podcast gives a model: a notebook's sources (their
full text or their insights) and notes, each with its size, cut at a budget; and its
rendering as text. No Flask here: the job worker uses it too."""

from typing import Any

from app.common.failures import Invalid
from app.notebook.core.ids import public
from app.notebook.core.models import Insight, Note, Source, SourceNotebook

CHARS_PER_TOKEN = 4  # a rough estimate, said to be one in the answer

# What a chat's context takes of each source or note. Open Notebook's UI sends "not in"
# for an item left out (its server matches "not in" as a substring); both spellings of
# "left out" are taken, nothing else.
EXCLUDED = ("not in context", "not in")
MODES = ("full content", "insights", *EXCLUDED)
PARTS = ("sources", "notes")


def checked_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A request's context_config, every mode one of MODES (else a 400 naming its part):
    the one rule of /chat/context and Open Notebook's /notebooks/{id}/context."""
    config = config or {}
    for part in PARTS:
        for item_id, mode in (config.get(part) or {}).items():
            if mode not in MODES:
                raise Invalid(
                    f"context_config.{part}.{item_id}: must be one of {', '.join(MODES)}",
                    field=f"context_config.{part}",
                )
    return config


def _source_text(source, mode):
    if mode == "insights":
        return "\n\n".join(
            f"{i.insight_type}: {i.content}"
            for i in Insight.select().where(Insight.source == source.id).order_by(Insight.created)
        )
    return source.full_text or ""


def build_context(notebook_key, config, max_chars):
    """{sources: [...], notes: [...]} of the notebook, each item with its size;
    `config` maps ids to a mode (default: full content); the whole is cut at `max_chars`."""
    wanted_sources, wanted_notes = config.get("sources") or {}, config.get("notes") or {}
    source_rows = (
        Source.select()
        .join(SourceNotebook)
        .where(SourceNotebook.notebook == notebook_key)
        .order_by(Source.created, Source.id)
    )
    note_rows = Note.select().where(Note.notebook == notebook_key).order_by(Note.created, Note.id)
    budget = [max_chars]
    context = {"sources": [], "notes": []}
    for row in source_rows:
        mode = wanted_sources.get(public("source", row.id), "full content")
        if mode not in EXCLUDED:
            context["sources"].append(_item(public("source", row.id), row.title, _source_text(row, mode), mode, budget))
    for row in note_rows:
        mode = wanted_notes.get(public("note", row.id), "full content")
        if mode not in EXCLUDED:
            context["notes"].append(_item(public("note", row.id), row.title, row.content, mode, budget))
    return context


def source_context(source, max_chars):
    """The context of a chat about one source: its text and its insights (each an item
    of `sources`, cut at `max_chars` together), and what it holds as Open Notebook's
    context indicators ({sources, insights, notes}: ids)."""
    budget = [max_chars]
    items = [_item(public("source", source.id), source.title, source.full_text or "", "full content", budget)]
    insight_ids = []
    for insight in Insight.select().where(Insight.source == source.id).order_by(Insight.created, Insight.id):
        insight_ids.append(public("insight", insight.id))
        items.append(_item(insight_ids[-1], insight.insight_type, insight.content, "insights", budget))
    indicators = {"sources": [public("source", source.id)], "insights": insight_ids, "notes": []}
    return {"sources": items, "notes": []}, indicators


def _item(item_id, title, text, mode, budget):
    kept = text[: max(0, budget[0])]
    budget[0] -= len(kept)
    return {
        "id": item_id,
        "title": title or "",
        "mode": mode,
        "content": kept,
        "chars": len(kept),
        "truncated": len(kept) < len(text),
    }


def sizes(context):
    chars = sum(item["chars"] for part in ("sources", "notes") for item in context.get(part, []))
    return {"char_count": chars, "token_count": -(-chars // CHARS_PER_TOKEN)}


def render_context(context):
    blocks = [
        f"[{item.get('id')}] {item.get('title') or ''}\n{item.get('content') or ''}"
        for part in ("sources", "notes")
        for item in (context.get(part) or [])
        if isinstance(item, dict)
    ]
    return "\n\n".join(blocks)
