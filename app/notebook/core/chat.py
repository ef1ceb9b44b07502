"""A chat session's turns, shared by the notebook chat and the source chat: the
messages sent to the model (a system prompt with the context, the recent history,
the new message) and the turn stored once the model has answered, never before (a
failed call changes nothing). No Flask here."""

from collections.abc import Iterator
from typing import Any

from app.notebook import llm
from app.notebook.core.context import render_context
from app.notebook.core.model_choice import Resolved
from app.notebook.core.models import ChatMessage, ChatSession, database, now, write_transaction

HISTORY_TURNS = 50  # the most recent messages sent back to the model

Message = dict[str, str]


def history(session_key: str) -> list[ChatMessage]:
    return list(ChatMessage.select().where(ChatMessage.session == session_key).order_by(ChatMessage.id))


def messages_for(
    session_key: str, system: str, context: dict[str, Any] | None, message: str, max_chars: int
) -> list[Message]:
    """The model's input: `system` with the context's text (cut at `max_chars`), the
    session's recent history, then `message`."""
    text = render_context(context) if context else ""
    if text:
        system += "\n\nContext:\n" + text[:max_chars]
    earlier = [
        {"role": "user" if m.role == "human" else "assistant", "content": m.content}
        for m in history(session_key)[-HISTORY_TURNS:]
    ]
    return [{"role": "system", "content": system}, *earlier, {"role": "user", "content": message}]


def store_turn(session_key: str, message: str, reply: str) -> None:
    with write_transaction():
        ChatMessage.create(session=session_key, role="human", content=message)
        ChatMessage.create(session=session_key, role="ai", content=reply)
        ChatSession.update(updated=now()).where(ChatSession.id == session_key).execute()


def streamed_turn(session_key: str, message: str, resolved: Resolved, messages: list[Message]) -> Iterator[str]:
    """The reply's pieces as the model sends them; the turn is stored once the reply
    is whole. Runs in a stream's greenlet: a database connection is taken only for
    the store, never across the model call."""
    parts = []
    for delta in llm.chat_stream(resolved.target, resolved.name, messages):
        parts.append(delta)
        yield delta
    with database.connection_context():
        store_turn(session_key, message, "".join(parts))
