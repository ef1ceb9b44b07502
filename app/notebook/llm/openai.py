"""OpenAI's API and every server that speaks it (vLLM, llama.cpp's server, LM
Studio, OpenRouter): base URL ending in /v1. Chat completions (streamed as SSE
`data: {...}` records ended by `data: [DONE]`), models, embeddings and speech."""
import json

from app.notebook.llm.transport import ProviderError, call_bytes, call_json, malformed, stream_records

NAME = "the OpenAI-compatible provider"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_SPEECH_BYTES = 50 * 1024 * 1024


def _headers(target):
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


def chat(target, model, messages):
    answer = call_json(target, NAME, "POST", "/chat/completions", _headers(target),
                       {"model": model, "messages": messages, "stream": False})
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise malformed(NAME, "no choices[0].message.content") from None
    if not isinstance(content, str):
        raise malformed(NAME, "the content is not text")
    return content


def chat_stream(target, model, messages):
    """The reply's text deltas as the provider sends them."""
    body = {"model": model, "messages": messages, "stream": True}
    for record in stream_records(target, NAME, "POST", "/chat/completions", _headers(target), body):
        data = record.data.strip()
        if data == "[DONE]":
            return
        try:
            choices = json.loads(data).get("choices") or []
            delta = (choices[0].get("delta") or {}).get("content") if choices else None
        except (ValueError, AttributeError, IndexError, RecursionError):
            raise malformed(NAME, "a stream record is not a chat.completion.chunk") from None
        if delta:
            yield delta


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
    audio, content_type = call_bytes(target, NAME, "POST", "/audio/speech", _headers(target),
                                     {"model": model, "input": text, "voice": voice or "alloy",
                                      "response_format": "mp3"}, MAX_SPEECH_BYTES)
    if not audio or content_type.startswith(("application/json", "text/")):
        raise malformed(NAME, "the speech answer is not audio")
    return audio


def unsupported(what):
    return ProviderError(400, f"this provider has no {what} models")
