"""How a transformation is applied to a text: the messages (its prompt is data, sent
as the system message exactly as written, never rendered as a template, after the
default instructions that every transformation shares) and the model that runs it.
No Flask here: the job worker uses it too."""

from app.notebook.core import app_settings
from app.notebook.core.ids import public

TRUNCATED = "\n\n[… the rest of the text was cut: it is longer than NOTEBOOK_CONTEXT_MAX_CHARS]"
# The setting that holds Open Notebook's "default prompt": text put before every
# transformation's own prompt (empty, the default here: nothing is).
INSTRUCTIONS = "transformation_instructions"


def default_instructions() -> str:
    value = app_settings.stored([INSTRUCTIONS]).get(INSTRUCTIONS)
    return value if isinstance(value, str) else ""


def set_default_instructions(text: str) -> None:
    app_settings.put({INSTRUCTIONS: text})


def messages_for(prompt, text, max_chars):
    """The chat messages that apply `prompt` (after the default instructions, as Open
    Notebook does) to `text` (cut at `max_chars`)."""
    if len(text) > max_chars:
        text = text[:max_chars] + TRUNCATED
    instructions = default_instructions()
    system = f"{instructions}\n\n{prompt}" if instructions else prompt
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def model_override(record, requested):
    """The model a run of `record` uses: the request's, else the transformation's own,
    else None (the default transformation model)."""
    return requested or public("model", record.model_id)
