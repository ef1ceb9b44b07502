"""A local server that speaks three model providers' real HTTP APIs, for the tests
and benchmarks of the notebook and the prompt wizard, and for trying them without a
provider (the real providers are outside this machine). It is the one fake model
provider: the OpenAI-compatible API the wizard calls is its /v1.

    with FakeProviders(host="127.0.0.3", keys={"openai": "sk-test"}) as fake:
        fake.base_url("openai")      # http://127.0.0.3:PORT/v1 (also fake.base_url())
        fake.base_url("ollama")      # http://127.0.0.3:PORT/ollama
        fake.base_url("anthropic")   # http://127.0.0.3:PORT/anthropic
        fake.seen                    # every request: provider, path, headers, body, received and
                                     # first-byte times, the client's port
        fake.count("fake-text")      # requests of a wizard scenario (below) answered
        fake.requests                # (path, body) of each of those, in order

    python -m devtools.fake_providers serve --host 127.0.0.3 --port 8766 [--key KEY] [--slow 0.5]

Routes (the providers' own shapes):
- OpenAI (/v1): POST chat/completions (stream: SSE `data: {chunk}` … `data: [DONE]`),
  POST images/generations, GET models, POST embeddings, POST audio/speech (an MP3).
- Ollama (/ollama): POST api/chat (stream: NDJSON lines, the last `"done": true`),
  GET api/tags, POST api/embed.
- Anthropic (/anthropic): POST v1/messages (stream: SSE message_start,
  content_block_delta …, message_stop), GET v1/models; `x-api-key`.
- GET /_seen (the request log as JSON), GET /_calls ({scenario: requests}), POST /_reset,
  POST /_mode {"mode": …}; GET /files/<name> (the images of fake-url-png).

What it answers, like a model that follows its prompt: a system prompt asking for
`"searches"` gets a search plan (the question's long words), one asking for
`"turns"` a dialogue between the speakers it names ("Speaker names: A, B"), anything
else a sentence that cites the first `source:<key>` the messages contain.

Failures, chosen by a word of the model name (between dashes), or for every request by the
mode: `malformed` (200 that is not the API's shape), `slow` (drips a byte every
0.2 s for a minute), `429`, `401`, `404` (the model does not exist), `500`. A provider
given a key answers 401 to any other key; OpenAI's, as OpenAI does, with an error that
echoes part of the key sent (so tests can check that it never reaches a message).

The wizard's scenarios: on /v1 a chat completion or an image whose model is one of
these names answers as that scenario (before the words above). Each answer's `model`
(but fake-no-model's) is "<scenario>-resolved", so tests can tell the reported model
from the requested one; an image of any other model is 404, as on OpenAI.
- fake-text            plain text: "Hello from the fake provider."
- fake-valid-json      {"ok": true, "words": [...]}
- fake-repairable      fenced JSON with a trailing comma: invalid, json-repair fixes it
- fake-invalid-twice   prose with no JSON in it, on every call
- fake-prose-brackets  prose with stray brackets and braces in it (json-repair alone makes a value of it)
- fake-invalid-once    prose on odd calls of the scenario, valid JSON on even ones (a rerun)
- fake-ideas-4 / -5 / -6 / -7   {"ideas": [{title, description}] * n}
- fake-slow            waits `slow` seconds (default 0.5) before answering valid JSON
- fake-error-500       HTTP 500 with an OpenAI-shaped error body
- fake-malformed       HTTP 200 whose body is not JSON
- fake-no-model        valid JSON content, the answer omits `model`
- fake-reasoning       streams reasoning deltas (`reasoning_content`) before the content
A streamed scenario sends the content in small deltas, each flushed on its own, then a
record with `finish_reason` and `data: [DONE]`. Images (a real image made with Pillow,
1/16 of the requested size):
- fake-webp            a WebP, as b64_json
- fake-png             a PNG, as b64_json
- fake-url-png         only a `url` to a PNG served by this server (GET /files/<name>)
- fake-no-image        {"data": []}
- fake-bad-image       b64_json of bytes that are no image
- fake-slow-image      waits `slow` seconds, then a PNG
- fake-error-500       as above

Think time (for the benchmark), before the answer's first byte: a model name with
`think-<ms>` thinks that long on every call; a message holding
`[fake: answer at <unix time>]` makes the call wait until that moment (a later call
of the same conversation, past the moment, answers at once). The marker is not
part of what the model "reads". Once it answers, it answers at once: a whole
non-streamed answer goes out in one write, and `first_byte` (time.time(), the same
clock as any other process's on this machine) is taken just before that write, so
that it is in the log by the time the caller holds the answer.
"""

import argparse
import base64
import hashlib
import io
import json
import math
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

from PIL import Image

from devtools.fake_server import BackgroundServer, QuietThreadingServer

PREFIXES = {"openai": "/v1", "ollama": "/ollama", "anthropic": "/anthropic"}
FAILURES = ("malformed", "slow", "429", "401", "404", "500")
THINK_MODEL = re.compile(r"think-(\d{1,6})")
ANSWER_AT = re.compile(r"\[fake: answer at (\d{1,12}(?:\.\d{1,9})?)\]")
DIMENSIONS = 32
OPENAI_MODELS = ["fake-chat", "fake-embed", "fake-tts"]
OLLAMA_MODELS = ["llama-fake:latest", "nomic-fake:latest"]
ANTHROPIC_MODELS = ["claude-fake-1", "claude-fake-2"]

TEXT_SCENARIOS = {
    "fake-text",
    "fake-valid-json",
    "fake-repairable",
    "fake-invalid-twice",
    "fake-prose-brackets",
    "fake-invalid-once",
    "fake-ideas-4",
    "fake-ideas-5",
    "fake-ideas-6",
    "fake-ideas-7",
    "fake-slow",
    "fake-error-500",
    "fake-malformed",
    "fake-no-model",
    "fake-reasoning",
}
IMAGE_SCENARIOS = {
    "fake-webp",
    "fake-png",
    "fake-url-png",
    "fake-no-image",
    "fake-bad-image",
    "fake-slow-image",
    "fake-error-500",
}
PROSE = "I am sorry, but I would rather describe the answer in plain words today."
PROSE_BRACKETS = "I would suggest [a calm palette] and {soft light, warm tones}, as in [1] and [2."
VALID_JSON = {"ok": True, "words": ["alpha", "beta", "gamma"]}
REPAIRABLE = 'Here it is:\n```json\n{"title": "Repairable", "items": [1, 2, 3],}\n```'
REASONING = "Let me think about this. "


class FakeProviders(BackgroundServer):
    thread_name = "fake-providers"

    def __init__(self, host="127.0.0.3", port=0, keys=None, drip_seconds=60.0, slow=0.5):
        self.keys = dict(keys or {})
        self.mode = None
        self.drip_seconds = drip_seconds
        self.slow = slow  # the wait of the wizard's slow scenarios
        self.seen = []
        self.calls = Counter()  # wizard scenario: requests answered
        self.requests = []  # (path, body) of each of those, in order
        self._lock = threading.Lock()
        self._files = {}
        self._server = QuietThreadingServer((host, port), _handler(self))
        self.host = host

    def base_url(self, provider="openai"):
        return f"http://{self.host}:{self.port}{PREFIXES[provider]}"

    def count(self, scenario):
        with self._lock:
            return self.calls[scenario]

    def reset(self):
        with self._lock:
            self.seen.clear()
            self.calls.clear()
            self.requests.clear()
            self.mode = None

    def _count(self, path, body):
        """Counts a scenario's request; returns how many it has had, this one included."""
        with self._lock:
            self.requests.append((path, body))
            self.calls[str(body.get("model"))] += 1
            return self.calls[str(body.get("model"))]

    def requests_to(self, path_end):
        with self._lock:
            return [r for r in self.seen if r["path"].endswith(path_end)]

    def _record(self, entry):
        with self._lock:
            self.seen.append(entry)


# --------------------------------------------------------------------------- what a "model" says


def reply_text(model, messages):
    system = "\n".join(m.get("content", "") for m in messages if m.get("role") == "system")
    question = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
    question = ANSWER_AT.sub("", question)
    if '"searches"' in system:
        words = list(dict.fromkeys(w.lower() for w in re.findall(r"[A-Za-z]{5,}", question)))[:3]
        return json.dumps(
            {
                "reasoning": f"I will look up {', '.join(words) or 'the question'}.",
                "searches": [{"term": w, "instructions": f"what the sources say about {w}"} for w in words],
            }
        )
    if '"turns"' in system:
        found = re.search(r"Speaker names: ([^\n]+)", system)
        names = [n.strip() for n in found.group(1).split(",")] if found else ["Host"]
        return json.dumps(
            {
                "turns": [
                    {"speaker": names[i % len(names)], "text": f"Line {i + 1} about the notes."}
                    for i in range(max(2, len(names)))
                ]
            }
        )
    everything = "\n".join(m.get("content", "") for m in messages)
    cited = re.search(r"source:[a-z0-9]+", everything)
    citation = f" [{cited.group(0)}]" if cited else ""
    return f"Reply from {model}{citation} to: {question[:60]}"


def vector(text):
    values = [0.0] * DIMENSIONS
    for word in re.findall(r"\w+", text.lower()):
        values[int(hashlib.sha256(word.encode()).hexdigest(), 16) % DIMENSIONS] += 1.0
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _pieces(text, size=8):
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _is_scenario(route, body):
    model = body.get("model") if isinstance(body, dict) else None
    return (route == "/chat/completions" and model in TEXT_SCENARIOS) or (
        route == "/images/generations" and isinstance(model, str)
    )


def _scenario_content(model, nth):
    if model == "fake-text":
        return "Hello from the fake provider."
    if model == "fake-repairable":
        return REPAIRABLE
    if model == "fake-invalid-twice" or (model == "fake-invalid-once" and nth % 2 == 1):
        return PROSE
    if model == "fake-prose-brackets":
        return PROSE_BRACKETS
    if model.startswith("fake-ideas-"):
        count = int(model.rsplit("-", 1)[1])
        ideas = [{"title": f"Idea {i}", "description": f"What idea {i} is about."} for i in range(1, count + 1)]
        return json.dumps({"ideas": ideas})
    if model == "fake-slow":
        return json.dumps({"slow": True})
    return json.dumps(VALID_JSON)


def _chunk(model, delta, finish_reason):
    record = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if model:
        record["model"] = model
    return record


def _image(size, kind):
    """A real image of 1/16 the requested size (at least 8x8), as PNG or WebP bytes."""
    try:
        width, height = (max(8, int(n) // 16) for n in str(size).split("x"))
    except ValueError:
        width, height = 64, 64
    img = Image.new("RGB", (width, height), (40, 120, 200))
    img.paste((240, 200, 40), (0, 0, width // 2, height // 2))
    out = io.BytesIO()
    img.save(out, kind)
    return out.getvalue()


def _silence_mp3():
    from app.common.tts import encode

    return encode(b"\x00\x00" * 4410, 22050)


# --------------------------------------------------------------------------- HTTP


def _handler(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def _route(self, method):
            body = self._body()
            received = time.time()
            self.entry = None  # (a kept-alive connection's handler serves many requests)
            if self.path == "/_seen":
                with fake._lock:
                    return self._json(200, fake.seen)
            if self.path == "/_calls":
                with fake._lock:
                    return self._json(200, dict(fake.calls))
            if method == "GET" and self.path.startswith("/files/") and self.path[7:] in fake._files:
                return self._send(200, fake._files[self.path[7:]], "image/png")
            if self.path == "/_reset":
                fake.reset()
                return self._json(200, {})
            if self.path == "/_mode":
                fake.mode = (body or {}).get("mode")
                return self._json(200, {"mode": fake.mode})
            provider = next((p for p, prefix in PREFIXES.items() if self.path.startswith(prefix + "/")), None)
            if provider is None:
                return self._json(404, {"error": "not found"})
            route = self.path[len(PREFIXES[provider]) :]
            # Logged before it is answered: a caller that has its answer finds its request in the log.
            self.provider, self.entry = (
                provider,
                {
                    "provider": provider,
                    "path": self.path,
                    "method": method,
                    "body": body,
                    "received": received,
                    "client_port": self.client_address[1],  # one port per connection: keep-alive shows
                    "authorization": self.headers.get("Authorization"),
                    "x_api_key": self.headers.get("x-api-key"),
                    "anthropic_version": self.headers.get("anthropic-version"),
                    "first_byte": None,
                },
            )
            fake._record(self.entry)
            if provider == "openai" and method == "POST" and _is_scenario(route, body):
                return self._scenario(route, body)
            self._answer(provider, method, route, body or {})

        def _failure(self, body):
            # A whole word of the name: a name's number ("gpt-401-1234429…") never picks one.
            words = set(re.split(r"[-:/]", str(body.get("model", ""))))
            return fake.mode or next((word for word in FAILURES if word in words), None)

        def _think(self, body):
            model = THINK_MODEL.search(str(body.get("model", "")))
            if model:
                time.sleep(int(model.group(1)) / 1000.0)
            texts = [str(body.get("system") or "")] + [
                str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict)
            ]
            moment = next((float(found.group(1)) for found in map(ANSWER_AT.search, texts) if found), None)
            if moment is not None:
                time.sleep(min(600.0, max(0.0, moment - time.time())))

        def _answer(self, provider, method, route, body):
            self._think(body)
            failure = self._failure(body)
            if failure == "401" or not self._key_ok(provider):
                return self._unauthorized()
            if failure == "404":
                return self._openai_error(404, f"The model `{body.get('model')}` does not exist", "model_not_found")
            if failure in ("429", "500"):
                return self._json(int(failure), {"error": {"message": "no", "type": "fail"}})
            if failure == "slow":
                return self._drip()
            if failure == "malformed":
                return self._send(200, b'{"unexpected": true', "application/json")
            handler = ROUTES.get((provider, method, route))
            if handler is None:
                return self._json(404, {"error": {"message": f"no route {method} {route}"}})
            handler(self, body)

        def _unauthorized(self):
            if self.provider == "openai":
                shown = self._sent_key()
                # OpenAI's wording, partial key included: callers must not pass it on.
                return self._openai_error(
                    401,
                    f"Incorrect API key provided: {shown[:3]}***{shown[-4:]}. You can "
                    "find your API key at https://platform.openai.com/account/api-keys.",
                    "invalid_api_key",
                )
            self._json(
                401, {"error": {"message": f"Incorrect API key provided: {self._sent_key()[:6]}…", "type": "auth"}}
            )

        def _openai_error(self, status, message, code=None):
            self._json(
                status, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
            )

        def _sent_key(self):
            if self.provider == "anthropic":
                return self.headers.get("x-api-key") or ""
            return (self.headers.get("Authorization") or "").removeprefix("Bearer ")

        def _key_ok(self, provider):
            expected = fake.keys.get(provider)
            return expected is None or self._sent_key() == expected

        # -- the wizard's scenarios ----------------------------------------------------

        def _scenario(self, route, body):
            if not self._key_ok("openai"):
                return self._unauthorized()
            model = body["model"]
            if route == "/images/generations" and model not in IMAGE_SCENARIOS:
                return self._openai_error(404, f"The model `{model}` does not exist", "model_not_found")
            nth = fake._count(self.path, body)
            if route == "/chat/completions":
                return self._scenario_chat(body, model, nth)
            self._scenario_image(body, model, nth)

        def _scenario_chat(self, body, model, nth):
            if model == "fake-slow":
                time.sleep(fake.slow)
            if model == "fake-error-500":
                return self._openai_error(500, "The fake provider had an internal error", "server_error")
            if model == "fake-malformed":
                return self._send(200, b"<html>not json</html>", "application/json")
            content = _scenario_content(model, nth)
            reported = None if model == "fake-no-model" else f"{model}-resolved"
            if body.get("stream") is True:
                deltas = (
                    [{"reasoning_content": part} for part in _pieces(REASONING, 7)] if model == "fake-reasoning" else []
                )
                deltas = [{"role": "assistant", "content": ""}] + deltas
                deltas += [{"content": part} for part in _pieces(content, 7)]
                records = [_chunk(reported, delta, None) for delta in deltas] + [_chunk(reported, {}, "stop")]
                lines = [b"data: " + json.dumps(r).encode() + b"\n\n" for r in records] + [b"data: [DONE]\n\n"]
                return self._stream("text/event-stream", lines)
            answer = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                ],
            }
            if reported:
                answer["model"] = reported
            self._json(200, answer)

        def _scenario_image(self, body, model, nth):
            if model == "fake-slow-image":
                time.sleep(fake.slow)
            if model == "fake-error-500":
                return self._openai_error(500, "The fake provider had an internal error", "server_error")
            if model == "fake-no-image":
                return self._json(200, {"created": int(time.time()), "data": []})
            if model == "fake-bad-image":
                item = {"b64_json": base64.b64encode(b"these bytes are no image").decode()}
            elif model == "fake-url-png":
                name = f"image-{nth}.png"
                fake._files[name] = _image(body.get("size"), "PNG")
                item = {"url": f"http://{fake.host}:{fake.port}/files/{name}"}
            else:
                kind = "WEBP" if model == "fake-webp" else "PNG"
                item = {"b64_json": base64.b64encode(_image(body.get("size"), kind)).decode()}
            self._json(200, {"created": int(time.time()), "data": [item]})

        # -- answers ----------------------------------------------------------------

        def openai_chat(self, body):
            text = reply_text(body.get("model"), body.get("messages") or [])
            if body.get("stream"):
                records = [
                    {
                        "object": "chat.completion.chunk",
                        "model": body.get("model"),
                        "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
                    }
                    for piece in _pieces(text)
                ]
                lines = [b"data: " + json.dumps(r).encode() + b"\n\n" for r in records] + [b"data: [DONE]\n\n"]
                return self._stream("text/event-stream", lines)
            self._json(
                200,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                    ],
                },
            )

        def openai_models(self, body):
            self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in OPENAI_MODELS]})

        def openai_embeddings(self, body):
            inputs = body.get("input") if isinstance(body.get("input"), list) else [body.get("input", "")]
            self._json(
                200,
                {
                    "object": "list",
                    "model": body.get("model"),
                    "data": [{"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(inputs)],
                },
            )

        def openai_speech(self, body):
            self._send(200, _silence_mp3(), "audio/mpeg")

        def ollama_chat(self, body):
            text = reply_text(body.get("model"), body.get("messages") or [])
            if body.get("stream", True):
                lines = [
                    json.dumps(
                        {"model": body.get("model"), "message": {"role": "assistant", "content": p}, "done": False}
                    ).encode()
                    + b"\n"
                    for p in _pieces(text)
                ]
                lines.append(json.dumps({"model": body.get("model"), "done": True}).encode() + b"\n")
                return self._stream("application/x-ndjson", lines)
            self._json(
                200, {"model": body.get("model"), "message": {"role": "assistant", "content": text}, "done": True}
            )

        def ollama_tags(self, body):
            self._json(200, {"models": [{"name": m, "model": m, "size": 1} for m in OLLAMA_MODELS]})

        def ollama_embed(self, body):
            inputs = body.get("input") if isinstance(body.get("input"), list) else [body.get("input", "")]
            self._json(200, {"model": body.get("model"), "embeddings": [vector(t) for t in inputs]})

        def anthropic_messages(self, body):
            messages = list(body.get("messages") or [])
            if body.get("system"):
                messages.insert(0, {"role": "system", "content": body["system"]})
            text = reply_text(body.get("model"), messages)
            if body.get("stream"):
                events = [
                    ("message_start", {"type": "message_start", "message": {"id": "msg_fake", "content": []}}),
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    ),
                ]
                events += [
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
                    )
                    for p in _pieces(text)
                ]
                events += [
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
                    ("message_stop", {"type": "message_stop"}),
                ]
                lines = [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]
                return self._stream("text/event-stream", lines)
            self._json(
                200,
                {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model"),
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn",
                },
            )

        def anthropic_models(self, body):
            self._json(
                200,
                {"data": [{"id": m, "type": "model", "display_name": m} for m in ANTHROPIC_MODELS], "has_more": False},
            )

        # -- wire ---------------------------------------------------------------------

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else {}
            except ValueError:
                return None

        def _head(self, status, content_type, length=None, data=b""):
            """The head (with `data`, a whole body, in the same write)."""
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            if length is None:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(length))
            self._headers_buffer.append(b"\r\n" + data)  # what end_headers() appends, and the body
            if self.entry is not None:
                # Stamped before the write: once the bytes are out the caller may read the log at once.
                self.entry["first_byte"] = time.time()
            self.flush_headers()
            self.wfile.flush()

        def _send(self, status, data, content_type):
            self._head(status, content_type, len(data), data)

        def _json(self, status, payload):
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _stream(self, content_type, pieces):
            self._head(200, content_type)
            for piece in pieces:
                self.wfile.write(piece)
                self.wfile.flush()

        def _drip(self):
            """Headers at once, then a byte at a time: no read waits long, the whole never ends."""
            self._head(200, "application/json")
            end = time.monotonic() + fake.drip_seconds
            while time.monotonic() < end:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)

    return Handler


def _routes():
    return {
        ("openai", "POST", "/chat/completions"): lambda h, b: h.openai_chat(b),
        ("openai", "GET", "/models"): lambda h, b: h.openai_models(b),
        ("openai", "POST", "/embeddings"): lambda h, b: h.openai_embeddings(b),
        ("openai", "POST", "/audio/speech"): lambda h, b: h.openai_speech(b),
        ("ollama", "POST", "/api/chat"): lambda h, b: h.ollama_chat(b),
        ("ollama", "GET", "/api/tags"): lambda h, b: h.ollama_tags(b),
        ("ollama", "POST", "/api/embed"): lambda h, b: h.ollama_embed(b),
        ("anthropic", "POST", "/v1/messages"): lambda h, b: h.anthropic_messages(b),
        ("anthropic", "GET", "/v1/models"): lambda h, b: h.anthropic_models(b),
    }


ROUTES = _routes()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m devtools.fake_providers", description="Fake OpenAI, Ollama and Anthropic APIs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve until interrupted")
    serve.add_argument("--host", default="127.0.0.3")
    serve.add_argument("--port", type=int, default=8766)
    serve.add_argument("--key", default=None, help="OpenAI's /v1 requires Authorization: Bearer KEY")
    serve.add_argument("--slow", type=float, default=0.5, help="delay of the wizard's slow scenarios (s)")
    args = parser.parse_args(argv)
    fake = FakeProviders(
        host=args.host, port=args.port, keys={"openai": args.key} if args.key else None, slow=args.slow
    )
    print(
        f"fake providers on {fake.base_url('openai')}, {fake.base_url('ollama')}, {fake.base_url('anthropic')}",
        flush=True,
    )
    fake.serve_until_interrupted()


if __name__ == "__main__":
    main()
