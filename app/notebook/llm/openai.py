"""OpenAI's API and every server that speaks it (vLLM, llama.cpp's server, LM
Studio, OpenRouter): base URL ending in /v1. Chat completions (streamed as SSE
`data: {...}` records ended by `data: [DONE]`, read by app.common.openai_chat, which
the wizard shares), models, embeddings and speech."""

from app.common import openai_chat
from app.notebook.llm.transport import (
    ProviderError,
    Wording,
    call_bytes,
    call_json,
    malformed,
    open_exchange,
)

NAME = "the OpenAI-compatible provider"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_SPEECH_BYTES = 50 * 1024 * 1024
NOT_A_CHUNK = "{name}'s answer is malformed: a stream record is not a chat.completion.chunk"


class _ChatWording(Wording):
    """A chat answer's own failures: each one is "malformed". A stream's records without
    a choice (an error, usage) are read past, and a stream that stops without [DONE]
    has ended."""

    no_message = "{name}'s answer is malformed: no choices[0].message.content"
    no_text = "{name}'s answer is malformed: the content is not text"
    model_refused = None
    stream_not_json = stream_not_object = stream_bad_choice = NOT_A_CHUNK
    stream_error = None
    stream_too_large = "{name}'s answer is larger than {limit} bytes"  # (no limit is set)
    stream_incomplete = None
    whole_when_not_streamed = False


def _headers(target):
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


def _chat_call(target):
    """(post, wording) of one chat completion to `target`."""
    words = _ChatWording(NAME)
    return lambda body: open_exchange(target, words, "POST", openai_chat.PATH, _headers(target), body), words


def chat(target, model, messages):
    post, words = _chat_call(target)
    return openai_chat.complete(post, words, openai_chat.request_body(model, messages, stream=False)).content


def chat_stream(target, model, messages):
    """The reply's text deltas as the provider sends them."""
    post, words = _chat_call(target)
    for delta in openai_chat.stream(post, words, openai_chat.request_body(model, messages)):
        if delta.content:
            yield delta.content


def list_models(target):
    answer = call_json(target, NAME, "GET", "/models", _headers(target))
    try:
        return [{"name": item["id"]} for item in answer["data"]]
    except (KeyError, TypeError):
        raise malformed(NAME, "no data[].id in the models list") from None


def embed(target, model, texts):
    answer = call_json(target, NAME, "POST", "/embeddings", _headers(target), {"model": model, "input": list(texts)})
    try:
        vectors = [item["embedding"] for item in sorted(answer["data"], key=lambda item: item["index"])]
    except (KeyError, TypeError):
        raise malformed(NAME, "not an embeddings list") from None
    if len(vectors) != len(texts):
        raise malformed(NAME, "a different number of vectors than texts")
    return vectors


def speech(target, model, text, voice):
    audio, content_type = call_bytes(
        target,
        NAME,
        "POST",
        "/audio/speech",
        _headers(target),
        {"model": model, "input": text, "voice": voice or "alloy", "response_format": "mp3"},
        MAX_SPEECH_BYTES,
    )
    if not audio or content_type.startswith(("application/json", "text/")):
        raise malformed(NAME, "the speech answer is not audio")
    return audio


def unsupported(what):
    return ProviderError(400, f"this provider has no {what} models")
