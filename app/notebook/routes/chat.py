"""Chat sessions (`chat_session:<key>`) with their messages stored, the context
built from a notebook's sources and notes, and `POST /chat/execute` answering
with the model's reply and the history (or as SSE with `stream: true`).

A turn is stored only once the model answered: a failed call changes nothing."""

from flask import Blueprint

from app.common.failures import NotFound
from app.notebook.core import chat as turns
from app.notebook.core import model_choice
from app.notebook.core.context import build_context, checked_config, sizes, source_context
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import ChatMessage, ChatSession, Source, now
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


def get_session(public_id):
    record = ChatSession.get_or_none(ChatSession.id == key_of("chat_session", public_id, "chat session"))
    if record is None:
        raise NotFound(f"chat session {public_id[:80]!r} not found")
    return record


def session_view(record, with_messages=False):
    messages = turns.history(record.id) if with_messages else None
    count = (
        len(messages)
        if messages is not None
        else (ChatMessage.select().where(ChatMessage.session == record.id).count())
    )
    return serializers.chat_session(record, count, messages)


def model_key(model_id, field="model_override"):
    if not model_id:
        return None
    return model_choice.choose("chat", model_id, field).id


# --------------------------------------------------------------------------- sessions


@bp.get("/chat/sessions")
def list_sessions():
    """The chat sessions, optionally of one notebook, most recently updated first (a source's chat sessions are
    listed under the source)."""
    args = query(ChatSessionQuery)
    selection = ChatSession.select().where(ChatSession.source.is_null())
    if args.get("notebook_id"):
        selection = selection.where(ChatSession.notebook == get_notebook(args["notebook_id"]).id)
    return [session_view(s) for s in selection.order_by(ChatSession.updated.desc(), ChatSession.id)]


@bp.post("/chat/sessions")
def create_session():
    """Start a chat session, optionally tied to a notebook and a model (201)."""
    data = body(ChatSessionCreate())
    notebook_key = get_notebook(data["notebook_id"]).id if data.get("notebook_id") else None
    record = ChatSession.create(
        id=new_key(), title=data["title"], notebook=notebook_key, model_override=model_key(data.get("model_override"))
    )
    return session_view(record, with_messages=True), 201


@bp.get("/chat/sessions/<session_id>")
def read_session(session_id):
    """One chat session with its messages."""
    return session_view(get_session(session_id), with_messages=True)


@bp.put("/chat/sessions/<session_id>")
def update_session(session_id):
    """Rename a chat session or change its model."""
    record = get_session(session_id)
    data = body(ChatSessionUpdate())
    changes = {"updated": now()}
    if "title" in data:
        changes["title"] = data["title"]
    if "model_override" in data:
        changes["model_override"] = model_key(data["model_override"])
    ChatSession.update(**changes).where(ChatSession.id == record.id).execute()
    return session_view(ChatSession.get_by_id(record.id), with_messages=True)


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
    """The context a notebook gives a chat (each source and note included in full, as insights, or not: "not in
    context" or Open Notebook's "not in"), with its sizes."""
    data = body(ChatContextRequest())
    notebook = get_notebook(data["notebook_id"])
    config = checked_config(data.get("context_config"))
    context = build_context(notebook.id, config, settings().context_max_chars)
    return {"notebook_id": public("notebook", notebook.id), "context": context, **sizes(context)}


# --------------------------------------------------------------------------- execute


def _default_context(session):
    """The context of a turn that brings none: the session's source, or its notebook."""
    if session.source_id:
        source = Source.get_or_none(Source.id == session.source_id)
        return source_context(source, settings().context_max_chars)[0] if source else None
    if session.notebook_id:
        return build_context(session.notebook_id, {}, settings().context_max_chars)
    return None


@bp.post("/chat/execute")
def execute():
    """Send a message in a chat session and store the reply: at once, or streamed as SSE records with `stream`."""
    data = body(ChatExecute())
    session = get_session(data["session_id"])
    # The request's override, else the session's, else the default chat model.
    override = data.get("model_override") or public("model", session.model_override)
    resolved = model_choice.resolve(settings(), "chat", override, "model_override")
    context = data["context"] if data.get("context") is not None else _default_context(session)
    messages = turns.messages_for(session.id, SYSTEM_PROMPT, context, data["message"], settings().context_max_chars)
    if data["stream"]:
        return streams.sse(_streamed_reply(session, data["message"], resolved, messages))
    reply = model_choice.complete(resolved, messages)
    turns.store_turn(session.id, data["message"], reply)
    return {
        "session_id": public("chat_session", session.id),
        "model_id": resolved.id,
        "messages": [serializers.chat_message(m) for m in turns.history(session.id)],
    }


def _streamed_reply(session, message, resolved, messages):
    """Records: `delta` per piece of the reply, then `complete` with the stored reply."""
    parts = []
    for delta in turns.streamed_turn(session.id, message, resolved, messages):
        parts.append(delta)
        yield {"type": "delta", "content": delta}
    yield {
        "type": "complete",
        "session_id": public("chat_session", session.id),
        "model_id": resolved.id,
        "reply": "".join(parts),
    }
