"""Anthropic's messages API: POST /v1/messages (streamed as SSE events
message_start, content_block_delta with text_delta, message_stop) and GET
/v1/models; the key in `x-api-key`, the version in `anthropic-version`."""

import json

from app.notebook.llm.transport import call_json, malformed, stream_records

NAME = "Anthropic"
DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
MAX_TOKENS = 4096


def _headers(target):
    headers = {"anthropic-version": API_VERSION}
    if target.api_key:
        headers["x-api-key"] = target.api_key
    return headers


def _body(model, messages, stream):
    """Anthropic takes the system prompt apart, and turns that alternate starting
    with the user: consecutive turns of one role are joined."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = []
    for message in (m for m in messages if m["role"] != "system"):
        if turns and turns[-1]["role"] == message["role"]:
            turns[-1]["content"] += "\n\n" + message["content"]
        else:
            turns.append({"role": message["role"], "content": message["content"]})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": "(start)"})
    body = {"model": model, "max_tokens": MAX_TOKENS, "messages": turns, "stream": stream}
    if system:
        body["system"] = system
    return body


def chat(target, model, messages):
    answer = call_json(target, NAME, "POST", "/v1/messages", _headers(target), _body(model, messages, False))
    try:
        parts = [block["text"] for block in answer["content"] if block.get("type") == "text"]
    except (KeyError, TypeError, AttributeError):
        raise malformed(NAME, "no content blocks") from None
    if not parts or not all(isinstance(p, str) for p in parts):
        raise malformed(NAME, "no text in the content blocks")
    return "".join(parts)


def chat_stream(target, model, messages):
    stream = stream_records(target, NAME, "POST", "/v1/messages", _headers(target), _body(model, messages, True))
    for record in stream:  # (each record's `event:` name repeats its data's `type`)
        try:
            event = json.loads(record.data)
            kind = event["type"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise malformed(NAME, "a stream event is not JSON with a type") from None
        if kind == "message_stop":
            return
        if kind == "error":
            raise malformed(NAME, "the stream reported an error")
        if kind == "content_block_delta":
            text = (event.get("delta") or {}).get("text")
            if text:
                yield text
    raise malformed(NAME, "the stream ended without message_stop")


def list_models(target):
    answer = call_json(target, NAME, "GET", "/v1/models", _headers(target))
    try:
        return [{"name": item["id"], "description": _text_or_none(item.get("display_name"))} for item in answer["data"]]
    except (KeyError, TypeError, AttributeError):
        raise malformed(NAME, "no data[].id in the models list") from None


def _text_or_none(value):
    return value if isinstance(value, str) else None
