"""How a transformation is applied to a text: the messages (its prompt is data, sent
as the system message exactly as written, never rendered as a template) and the
model that runs it. No Flask here: the job worker uses it too."""

from app.notebook.core.ids import public

TRUNCATED = "\n\n[… the rest of the text was cut: it is longer than NOTEBOOK_CONTEXT_MAX_CHARS]"


def messages_for(prompt, text, max_chars):
    """The chat messages that apply `prompt` to `text` (cut at `max_chars`)."""
    if len(text) > max_chars:
        text = text[:max_chars] + TRUNCATED
    return [{"role": "system", "content": prompt}, {"role": "user", "content": text}]


def model_override(record, requested):
    """The model a run of `record` uses: the request's, else the transformation's own,
    else None (the default transformation model)."""
    return requested or public("model", record.model_id)
