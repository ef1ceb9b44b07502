"""The source chat (Open Notebook's `/sources/{id}/chat/sessions…`): a chat session
tied to one source, whose context is that source's text and insights. The sessions
are the notebook chat's (one table, one history, one model layer); a session of
another source, or of none, is not found here.

`POST …/{session_id}/messages` answers as SSE records, as Open Notebook's UI reads them:

    {"type": "user_message", "content", "timestamp"}      the message, echoed
    {"type": "ai_message", "content", "timestamp"}        a piece of the reply (the UI appends them)
    {"type": "context_indicators", "data": {sources, insights, notes}}
    {"type": "complete", "session_id", "model_id"}

or an `error` record ({message, detail, status}) that ends the stream, the model's
failure as it came. A bad body, an unknown source or session is a plain 400/404
before any stream (a model the request names included). No usable model otherwise
(no default chat model, a session's model gone, no key) is the stream's `error`
record right after `user_message`, so that the UI shows its
message; no text is ever made up and nothing is stored."""

from flask import Blueprint

from app.common.failures import Failure, Invalid, NotFound
from app.notebook.core import chat as turns
from app.notebook.core import model_choice
from app.notebook.core.context import source_context
from app.notebook.core.ids import key_of, new_key, public
from app.notebook.core.models import ChatSession, now
from app.notebook.core.records import get_source
from app.notebook.routes import streams
from app.notebook.routes.chat import get_session, model_key, session_view
from app.notebook.routes.http import body, settings
from app.notebook.routes.payloads import SourceChatCreate, SourceChatMessage, SourceChatUpdate
from app.notebook.routes.serializers import timestamp

bp = Blueprint("source_chat", __name__)

SYSTEM_PROMPT = (
    "You are a research assistant discussing one source with the user. Answer from the source and its insights "
    "below; when you use them, cite them by their id in brackets, for example [source:<id>] or [insight:<id>]. "
    "Say so when the source does not hold the answer."
)


def _source_session(source, session_id):
    """The session `session_id` of `source`; 404 when there is none, or it is another's."""
    session = get_session(session_id)
    if session.source_id != source.id:
        raise NotFound(f"chat session {session_id[:80]!r} not found for {public('source', source.id)}")
    return session


def _view(session, source=None):
    """Open Notebook's source chat session: the chat session's fields; given its
    `source`, its messages too and the indicators of the source's context once it has
    been used."""
    view = session_view(session, with_messages=source is not None)
    if source is not None:
        used = view["message_count"] > 0
        view["context_indicators"] = source_context(source, settings().context_max_chars)[1] if used else None
    return view


def _check_named_source(source, named):
    """The body's `source_id` (Open Notebook's UI sends the key without its prefix) must
    name the path's source."""
    if named is not None and key_of("source", named, "source_id") != source.id:
        raise Invalid(f"source_id: {named[:80]!r} is not the source of the path", field="source_id")


@bp.get("/sources/<source_id>/chat/sessions")
def list_sessions(source_id):
    """A source's chat sessions, most recently updated first."""
    source = get_source(source_id)
    sessions = ChatSession.select().where(ChatSession.source == source.id)
    return [_view(s) for s in sessions.order_by(ChatSession.updated.desc(), ChatSession.id)]


@bp.post("/sources/<source_id>/chat/sessions")
def create_session(source_id):
    """Start a chat session about a source (201)."""
    source = get_source(source_id)
    data = body(SourceChatCreate())
    _check_named_source(source, data.get("source_id"))
    session = ChatSession.create(
        id=new_key(),
        title=data.get("title") or f"Chat about {source.title or public('source', source.id)}"[:500],
        source=source.id,
        model_override=model_key(data.get("model_override")),
    )
    return _view(session, source), 201


@bp.get("/sources/<source_id>/chat/sessions/<session_id>")
def read_session(source_id, session_id):
    """A source chat session with its messages and the indicators of its context."""
    source = get_source(source_id)
    return _view(_source_session(source, session_id), source)


@bp.put("/sources/<source_id>/chat/sessions/<session_id>")
def update_session(source_id, session_id):
    """Rename a source chat session or change its model (null: the default)."""
    source = get_source(source_id)
    session = _source_session(source, session_id)
    data = body(SourceChatUpdate())
    changes = {"updated": now()}
    if "title" in data:
        changes["title"] = data["title"]
    if "model_override" in data:
        changes["model_override"] = model_key(data["model_override"])
    ChatSession.update(**changes).where(ChatSession.id == session.id).execute()
    return _view(ChatSession.get_by_id(session.id), source)


@bp.delete("/sources/<source_id>/chat/sessions/<session_id>")
def delete_session(source_id, session_id):
    """Delete a source chat session and its messages."""
    session = _source_session(get_source(source_id), session_id)
    ChatSession.delete().where(ChatSession.id == session.id).execute()
    return {"success": True, "message": "Source chat session deleted", "deleted": public("chat_session", session.id)}


@bp.post("/sources/<source_id>/chat/sessions/<session_id>/messages")
def send_message(source_id, session_id):
    """Send a message about the source: SSE records user_message, ai_message (pieces of the reply),
    context_indicators, complete (or error)."""
    source = get_source(source_id)
    session = _source_session(source, session_id)
    data = body(SourceChatMessage())
    message = data["message"]
    echo = {"type": "user_message", "content": message, "timestamp": timestamp(now())}
    if data.get("model_override"):  # the request's own model: an unknown one is its 404, before any stream
        model_choice.choose("chat", data["model_override"], "model_override")
    # The request's model, else the session's, else the default chat model.
    override = data.get("model_override") or public("model", session.model_override)
    try:
        resolved = model_choice.resolve(settings(), "chat", override, "model_override")
    except Failure as exc:
        return streams.sse([echo, streams.error_record(exc)])
    context, indicators = source_context(source, settings().context_max_chars)
    messages = turns.messages_for(session.id, SYSTEM_PROMPT, context, message, settings().context_max_chars)
    return streams.sse(_records(session, echo, resolved, messages, indicators))


def _records(session, echo, resolved, messages, indicators):
    yield echo
    for piece in turns.streamed_turn(session.id, echo["content"], resolved, messages):
        yield {"type": "ai_message", "content": piece, "timestamp": None}
    yield {"type": "context_indicators", "data": indicators}
    yield {"type": "complete", "session_id": public("chat_session", session.id), "model_id": resolved.id}
