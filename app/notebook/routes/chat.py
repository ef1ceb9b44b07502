"""Chat sessions (`chat_session:<key>`) with their messages stored, the context
built from a notebook's sources and notes, and `POST /chat/execute` answering
with the model's reply and the history (or as SSE with `stream: true`).

A turn is stored only once the model answered: a failed call changes nothing."""

from flask import Blueprint

from app.common.failures import Invalid, NotFound
from app.notebook import llm
from app.notebook.core import model_choice
from app.notebook.core.context import MODES, build_context, render_context, sizes
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import (
    ChatMessage,
    ChatSession,
    database,
    now,
    write_transaction,
)
from app.notebook.routes import serializers, streams
from app.notebook.routes.http import body, query, settings
from app.notebook.routes.notebooks import get_notebook
from app.notebook.routes.payloads import (
    ChatContextRequest,
    ChatExecute,
    ChatSessionCreate,
    ChatSessionQuery,
    ChatSessionUpdate,
)

bp = Blueprint("chat", __name__)

SYSTEM_PROMPT = (
    "You are a research assistant. Answer from the context below when it helps; when you use a "
    "source or note, cite it by its id in brackets, for example [source:<id>]. Say so when the "
    "context does not hold the answer."
)
HISTORY_TURNS = 50  # the most recent messages sent back to the model


def get_session(public_id):
    record = ChatSession.get_or_none(ChatSession.id == key_of("chat_session", public_id, "chat session"))
    if record is None:
        raise NotFound(f"chat session {public_id[:80]!r} not found")
    return record


def _history(session_key):
    return list(ChatMessage.select().where(ChatMessage.session == session_key).order_by(ChatMessage.id))


def _session_view(record, with_messages=False):
    messages = _history(record.id) if with_messages else None
    count = (
        len(messages)
        if messages is not None
        else (ChatMessage.select().where(ChatMessage.session == record.id).count())
    )
    return serializers.chat_session(record, count, messages)


def _model_key(model_id, field="model_override"):
    if not model_id:
        return None
    return model_choice.choose("chat", model_id, field).id


# --------------------------------------------------------------------------- sessions


@bp.get("/chat/sessions")
def list_sessions():
    """The chat sessions, optionally of one notebook, most recently updated first."""
    args = query(ChatSessionQuery)
    selection = ChatSession.select()
    if args.get("notebook_id"):
        selection = selection.where(ChatSession.notebook == get_notebook(args["notebook_id"]).id)
    return [_session_view(s) for s in selection.order_by(ChatSession.updated.desc(), ChatSession.id)]


@bp.post("/chat/sessions")
def create_session():
    """Start a chat session, optionally tied to a notebook and a model (201)."""
    data = body(ChatSessionCreate())
    notebook_key = get_notebook(data["notebook_id"]).id if data.get("notebook_id") else None
    record = ChatSession.create(
        id=new_key(), title=data["title"], notebook=notebook_key, model_override=_model_key(data.get("model_override"))
    )
    return _session_view(record, with_messages=True), 201


@bp.get("/chat/sessions/<session_id>")
def read_session(session_id):
    """One chat session with its messages."""
    return _session_view(get_session(session_id), with_messages=True)


@bp.put("/chat/sessions/<session_id>")
def update_session(session_id):
    """Rename a chat session or change its model."""
    record = get_session(session_id)
    data = body(ChatSessionUpdate())
    changes = {"updated": now()}
    if "title" in data:
        changes["title"] = data["title"]
    if "model_override" in data:
        changes["model_override"] = _model_key(data["model_override"])
    ChatSession.update(**changes).where(ChatSession.id == record.id).execute()
    return _session_view(ChatSession.get_by_id(record.id), with_messages=True)


@bp.delete("/chat/sessions/<session_id>")
def delete_session(session_id):
    """Delete a chat session and its messages."""
    record = get_session(session_id)
    ChatSession.delete().where(ChatSession.id == record.id).execute()
    return {"deleted": public("chat_session", record.id)}


# --------------------------------------------------------------------------- context


@bp.post("/chat/context/build")
@bp.post("/chat/context")
def context_route():
    """The context a notebook gives a chat (each source and note included in full, as insights, or not), with its
    sizes."""
    data = body(ChatContextRequest())
    notebook = get_notebook(data["notebook_id"])
    config = data.get("context_config") or {}
    for part in ("sources", "notes"):
        for item_id, mode in (config.get(part) or {}).items():
            if mode not in MODES:
                raise Invalid(
                    f"context_config.{part}.{item_id}: must be one of {', '.join(MODES)}",
                    field=f"context_config.{part}",
                )
    context = build_context(notebook.id, config, settings().context_max_chars)
    return {"notebook_id": public("notebook", notebook.id), "context": context, **sizes(context)}


# --------------------------------------------------------------------------- execute


def _messages(session, context, message):
    system = SYSTEM_PROMPT
    text = render_context(context) if context else ""
    if text:
        system += "\n\nContext:\n" + text[: settings().context_max_chars]
    history = [
        {"role": "user" if m.role == "human" else "assistant", "content": m.content}
        for m in _history(session.id)[-HISTORY_TURNS:]
    ]
    return [{"role": "system", "content": system}, *history, {"role": "user", "content": message}]


def _store_turn(session, message, reply):
    with write_transaction():
        ChatMessage.create(session=session.id, role="human", content=message)
        ChatMessage.create(session=session.id, role="ai", content=reply)
        ChatSession.update(updated=now()).where(ChatSession.id == session.id).execute()


@bp.post("/chat/execute")
def execute():
    """Send a message in a chat session and store the reply: at once, or streamed as SSE records with `stream`."""
    data = body(ChatExecute())
    session = get_session(data["session_id"])
    # The request's override, else the session's, else the default chat model.
    override = data.get("model_override") or public("model", session.model_override)
    resolved = model_choice.resolve(settings(), "chat", override, "model_override")
    context = data.get("context")
    if context is None and session.notebook_id:
        context = build_context(session.notebook_id, {}, settings().context_max_chars)
    messages = _messages(session, context, data["message"])
    if data["stream"]:
        return streams.sse(_streamed_reply(session, data["message"], resolved, messages))
    reply = model_choice.complete(resolved, messages)
    _store_turn(session, data["message"], reply)
    return {
        "session_id": public("chat_session", session.id),
        "model_id": resolved.id,
        "messages": [serializers.chat_message(m) for m in _history(session.id)],
    }


def _streamed_reply(session, message, resolved, messages):
    """Records: `delta` per piece of the reply, then `complete` with the stored reply."""
    parts = []
    for delta in llm.chat_stream(resolved.target, resolved.name, messages):
        parts.append(delta)
        yield {"type": "delta", "content": delta}
    reply = "".join(parts)
    with database.connection_context():  # the stream's greenlet holds none across the model call
        _store_turn(session, message, reply)
    yield {
        "type": "complete",
        "session_id": public("chat_session", session.id),
        "model_id": resolved.id,
        "reply": reply,
    }
