"""The OpenAI-compatible chat client, written once for the wizard and the notebook:
POST {base}/chat/completions, answered whole (`complete`) or streamed (`stream`: SSE
`data:` records of `chat.completion.chunk`, ended by `data: [DONE]`).

The HTTP (deadline, kept-alive pool, redirects, refusals) is app.common.provider_http's:
a service hands `post(body)`, which opens the request as an Exchange, and a ChatWording
(a provider_http.Wording) that says how it words the failures of the answer itself and
how strict it is with a stream. A template left None is a case that service tolerates:
the notebook reads past records that carry an error or no chunk, and takes a stream
that stops without `[DONE]` as ended; the wizard refuses both.

Every failure is `wording.error(502, message)`, as the transport's are."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from app.common.failures import ApiError
from app.common.provider_http import error_text, redacted

PATH = "/chat/completions"
JsonLoads = Callable[[bytes], Any]


class ChatRecord(Protocol):
    """One server-sent event (app.common.sse_client.Record)."""

    data: str


class ChatWording(Protocol):
    """What a service says of a chat answer (a provider_http.Wording subclass with
    these templates; the fields are the Wording's own: name, answer)."""

    name: str
    api_key: str
    no_message: str  # a whole answer without choices[0].message
    no_text: str  # ... whose content is not text
    model_refused: str | None  # ... with a `refusal` instead ({refusal}); None: no_text
    stream_not_json: str  # a record that is not JSON
    stream_not_object: str  # a record that is JSON but not an object
    stream_bad_choice: str | None  # an object whose choices/delta are not a chunk's; None: skipped
    stream_error: str | None  # a record carrying `error` ({detail}); None: skipped
    stream_too_large: str  # the streamed content past the limit ({limit})
    stream_incomplete: str | None  # ended with no [DONE] and no finish_reason; None: accepted
    whole_when_not_streamed: bool  # an answer that is not text/event-stream: read it whole

    def fail(self, status: int, template: str, **fields: Any) -> ApiError: ...


class ChatExchange(Protocol):
    """What is used of an opened provider_http.Exchange."""

    def header(self, name: str) -> str: ...

    def json(self, limit: int = ..., loads: JsonLoads = ...) -> Any: ...

    def records(self) -> Iterable[ChatRecord]: ...

    def close(self) -> None: ...


Post = Callable[[dict[str, Any]], ChatExchange]


@dataclass(frozen=True)
class ChatAnswer:
    """A whole answer: its text and the model the provider says answered (None if unsaid)."""

    content: str
    model: str | None


@dataclass(frozen=True)
class ChatDelta:
    """One streamed record's share: content and reasoning text (either may be ""),
    whether it closes the choice (`finish_reason`), and the model it reports."""

    content: str
    reasoning: str
    finished: bool
    model: str | None


def request_body(model: str, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    """The body of a chat completion: {model, messages, ...extra}."""
    return {"model": model, "messages": messages, **extra}


def complete(
    post: Post, wording: ChatWording, body: dict[str, Any], *, limit: int | None = None, loads: JsonLoads | None = None
) -> ChatAnswer:
    """One chat completion, answered whole."""
    exchange = post(body)
    try:
        return answer_of(_payload(exchange, limit, loads), wording)
    finally:
        exchange.close()


def stream(
    post: Post, wording: ChatWording, body: dict[str, Any], *, limit: int | None = None, loads: JsonLoads | None = None
) -> Iterator[ChatDelta]:
    """One chat completion, streamed (`stream: true` is added to `body`): its records'
    deltas as they arrive. The connection closes when the stream ends or is dropped."""
    exchange = post(dict(body, stream=True))
    try:
        if wording.whole_when_not_streamed and not is_event_stream(exchange):
            # A server that ignores `stream` answers one JSON body: one delta of it all.
            answer = answer_of(_payload(exchange, limit, loads), wording)
            yield ChatDelta(answer.content, "", True, answer.model)
            return
        yield from deltas(exchange.records(), wording, limit)
    finally:
        exchange.close()


def is_event_stream(exchange: ChatExchange) -> bool:
    return exchange.header("Content-Type").split(";")[0].strip().lower() == "text/event-stream"


def _payload(exchange: ChatExchange, limit: int | None, loads: JsonLoads | None) -> Any:
    """The parsed body, within the exchange's own defaults where none is given."""
    options: dict[str, Any] = {}
    if limit is not None:
        options["limit"] = limit
    if loads is not None:
        options["loads"] = loads
    return exchange.json(**options)


def answer_of(payload: Any, wording: ChatWording) -> ChatAnswer:
    """The text of a whole answer's first choice, and its reported model."""
    try:
        message = payload["choices"][0]["message"]
        content = message["content"]
    except (KeyError, IndexError, TypeError):
        raise wording.fail(502, wording.no_message) from None
    if not isinstance(content, str):
        refusal = message.get("refusal") if isinstance(message, dict) else None
        if wording.model_refused is not None and isinstance(refusal, str) and refusal:
            raise wording.fail(502, wording.model_refused, refusal=redacted(refusal))
        raise wording.fail(502, wording.no_text)
    return ChatAnswer(content, reported_model(payload))


def deltas(records: Iterable[ChatRecord], wording: ChatWording, limit: int | None = None) -> Iterator[ChatDelta]:
    """The deltas of a chat-completion stream's records, up to `data: [DONE]`."""
    finished, size = False, 0
    for record in records:
        data = record.data
        if data.strip() == "[DONE]":
            return
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
            raise wording.fail(502, wording.stream_not_json) from None
        if not isinstance(event, dict):
            raise wording.fail(502, wording.stream_not_object)
        if "error" in event and wording.stream_error is not None:
            detail: str = error_text(event, wording.api_key)
            raise wording.fail(502, wording.stream_error, detail=detail)
        delta, well_formed = _delta(event)
        if not well_formed and wording.stream_bad_choice is not None:
            raise wording.fail(502, wording.stream_bad_choice)
        finished = finished or delta.finished
        size += len(delta.content)
        if limit is not None and size > limit:
            raise wording.fail(502, wording.stream_too_large, limit=limit)
        yield delta
    if not finished and wording.stream_incomplete is not None:
        raise wording.fail(502, wording.stream_incomplete)


def _delta(event: dict[str, Any]) -> tuple[ChatDelta, bool]:
    """The first choice's delta of one record, and whether the record is shaped as a
    chunk. Records without a choice (usage-only, keep-alive) give an empty delta."""
    model = reported_model(event)
    choices = event.get("choices")
    if not choices:
        return ChatDelta("", "", False, model), True
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        return ChatDelta("", "", False, model), False
    choice = choices[0]
    finished = bool(choice.get("finish_reason"))
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        return ChatDelta("", "", finished, model), False
    content = delta.get("content")
    reason = delta.get("reasoning_content") or delta.get("reasoning")
    return ChatDelta(
        content if isinstance(content, str) else "", reason if isinstance(reason, str) else "", finished, model
    ), True


def reported_model(payload: Any) -> str | None:
    """The `model` an answer or a record reports, stripped; None when it says none."""
    model = payload.get("model") if isinstance(payload, dict) else None
    return model.strip() if isinstance(model, str) and model.strip() else None
