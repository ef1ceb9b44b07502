"""Ollama's native API: /api/chat (streamed as NDJSON lines, the last with
`"done": true`), /api/tags (the models pulled) and /api/embed."""

import json

from app.notebook.llm.transport import call_json, malformed, stream_lines

NAME = "Ollama"
DEFAULT_BASE_URL = "http://localhost:11434"


def _headers(target):
    # Ollama itself needs no key; one behind an authenticating proxy does.
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


def _with_options(target, body):
    """`body` with the credential's context window, when it sets one (else the
    server's default, which may cut a long context short)."""
    return {**body, "options": {"num_ctx": target.num_ctx}} if target.num_ctx else body


def _content(record):
    try:
        content = record["message"]["content"]
    except (KeyError, TypeError):
        raise malformed(NAME, "no message.content") from None
    if not isinstance(content, str):
        raise malformed(NAME, "the content is not text")
    return content


def chat(target, model, messages):
    answer = call_json(
        target,
        NAME,
        "POST",
        "/api/chat",
        _headers(target),
        _with_options(target, {"model": model, "messages": messages, "stream": False}),
    )
    return _content(answer)


def chat_stream(target, model, messages):
    body = _with_options(target, {"model": model, "messages": messages, "stream": True})
    for line in stream_lines(target, NAME, "POST", "/api/chat", _headers(target), body):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
            raise malformed(NAME, "a stream line is not JSON") from None
        if not isinstance(record, dict):
            raise malformed(NAME, "a stream line is not an object")
        if record.get("error"):
            raise malformed(NAME, "the stream reported an error")
        if record.get("done"):
            return
        text = _content(record)
        if text:
            yield text
    raise malformed(NAME, "the stream ended without `done`")


def list_models(target):
    answer = call_json(target, NAME, "GET", "/api/tags", _headers(target))
    try:
        return [{"name": item["name"]} for item in answer["models"]]
    except (KeyError, TypeError):
        raise malformed(NAME, "no models[].name in the tags list") from None


def embed(target, model, texts):
    body = _with_options(target, {"model": model, "input": list(texts)})
    answer = call_json(target, NAME, "POST", "/api/embed", _headers(target), body)
    vectors = answer.get("embeddings") if isinstance(answer, dict) else None
    if not isinstance(vectors, list) or len(vectors) != len(texts):
        raise malformed(NAME, "not one embedding per text")
    return vectors
