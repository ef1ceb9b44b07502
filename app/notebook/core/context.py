"""The context a chat, an ask or a podcast gives a model: a notebook's sources (their
full text or their insights) and notes, each with its size, cut at a budget; and its
rendering as text. No Flask here: the job worker uses it too."""

from app.notebook.core.ids import public
from app.notebook.core.models import Insight, Note, Source, SourceNotebook

CHARS_PER_TOKEN = 4  # a rough estimate, said to be one in the answer

MODES = ("full content", "insights", "not in context")


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
        if mode != "not in context":
            context["sources"].append(_item(public("source", row.id), row.title, _source_text(row, mode), mode, budget))
    for row in note_rows:
        mode = wanted_notes.get(public("note", row.id), "full content")
        if mode != "not in context":
            context["notes"].append(_item(public("note", row.id), row.title, row.content, mode, budget))
    return context


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
