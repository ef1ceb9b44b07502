"""A local HTTP server that speaks the OpenAI-compatible chat-completions and images API,
for tests and for trying the prompt wizard without a provider (the real one is outside
this machine).

In a test (a thread in the test process):

    with FakeOpenAI(key="test-key") as fake:
        Generator(base_url=fake.base_url, api_key="test-key", text_model="fake-valid-json", ...)
        fake.count("fake-invalid-once")   # requests received for that scenario

By hand (or for a service started by a test as a subprocess):

    .venv/bin/python -m devtools.fake_openai serve --port 8765 [--key KEY] [--slow 0.5]
    # base URL: http://127.0.0.1:8765/v1

Routes:
- POST /v1/chat/completions {model, messages, stream?}: a chat completion; with
  `stream: true` an SSE stream of `chat.completion.chunk` records (the content split in
  small deltas, each flushed on its own), ended by `data: [DONE]`.
- POST /v1/images/generations {model, prompt, size?, response_format?}: `{created, data:
  [{b64_json}]}`; the image is a real one made with Pillow, 1/16 of the requested size.
- GET /_calls → {scenario: requests received}; POST /_reset zeroes it (and the request log).
- With a key, every /v1 route needs `Authorization: Bearer <key>`; otherwise 401 with an
  OpenAI-shaped error that echoes part of the key sent, as OpenAI does (so tests can check
  that it never reaches a message).

Scenarios, chosen by the requested `model` (an unknown model is 404, as on OpenAI):
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
Images:
- fake-webp            a WebP, as b64_json
- fake-png             a PNG, as b64_json
- fake-url-png         only a `url` to a PNG served by this server (GET /files/<name>)
- fake-no-image        {"data": []}
- fake-bad-image       b64_json of bytes that are no image
- fake-slow-image      waits `slow` seconds, then a PNG
- fake-error-500       as above
Every answer's `model` (except fake-no-model) is "<scenario>-resolved", so tests can tell the
reported model from the requested one.
"""
import argparse
import base64
import io
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

from PIL import Image

from devtools.fake_server import BackgroundServer, QuietThreadingServer

TEXT_SCENARIOS = {"fake-text", "fake-valid-json", "fake-repairable", "fake-invalid-twice", "fake-prose-brackets",
                  "fake-invalid-once", "fake-ideas-4", "fake-ideas-5", "fake-ideas-6",
                  "fake-ideas-7", "fake-slow", "fake-error-500", "fake-malformed",
                  "fake-no-model", "fake-reasoning"}
IMAGE_SCENARIOS = {"fake-webp", "fake-png", "fake-url-png", "fake-no-image", "fake-bad-image",
                   "fake-slow-image", "fake-error-500"}
PROSE = "I am sorry, but I would rather describe the answer in plain words today."
PROSE_BRACKETS = "I would suggest [a calm palette] and {soft light, warm tones}, as in [1] and [2."
VALID_JSON = {"ok": True, "words": ["alpha", "beta", "gamma"]}
REPAIRABLE = 'Here it is:\n```json\n{"title": "Repairable", "items": [1, 2, 3],}\n```'
REASONING = "Let me think about this. "


class FakeOpenAI(BackgroundServer):
    thread_name = "fake-openai"

    def __init__(self, key=None, slow=0.5, host="127.0.0.1", port=0):
        self.key = key
        self.slow = slow
        self.calls = Counter()
        self.requests = []   # (path, body) of every /v1 request, in order
        self._lock = threading.Lock()
        self._files = {}
        self._server = QuietThreadingServer((host, port), _handler(self))
        self.host = host

    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}/v1"

    def count(self, scenario):
        with self._lock:
            return self.calls[scenario]

    def reset(self):
        with self._lock:
            self.calls.clear()
            self.requests.clear()

    def _record(self, path, body):
        """Counts the request; returns how many the scenario has had, this one included."""
        scenario = body.get("model") if isinstance(body, dict) else None
        with self._lock:
            self.requests.append((path, body))
            self.calls[str(scenario)] += 1
            return self.calls[str(scenario)]


def _handler(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass  # quiet: tests read the counts, not a log

        def do_GET(self):
            if self.path == "/_calls":
                with fake._lock:
                    return self._json(200, dict(fake.calls))
            if self.path.startswith("/files/") and self.path[7:] in fake._files:
                return self._send(200, fake._files[self.path[7:]], "image/png")
            self._error(404, "not found")

        def do_POST(self):
            body = self._body()
            if self.path == "/_reset":
                fake.reset()
                return self._json(200, {})
            if not self.path.startswith("/v1/"):
                return self._error(404, "not found")
            if not self._authorized():
                return
            if body is None:
                return self._error(400, "the body is not JSON")
            model = body.get("model")
            if self.path == "/v1/chat/completions" and model in TEXT_SCENARIOS:
                return self._chat(body, fake._record(self.path, body))
            if self.path == "/v1/images/generations" and model in IMAGE_SCENARIOS:
                return self._image(body, fake._record(self.path, body))
            if self.path in ("/v1/chat/completions", "/v1/images/generations"):
                return self._error(404, f"The model `{model}` does not exist", "model_not_found")
            self._error(404, "not found")

        # -- scenarios -------------------------------------------------------------

        def _chat(self, body, nth):
            model = body["model"]
            if model == "fake-slow":
                time.sleep(fake.slow)
            if model == "fake-error-500":
                return self._error(500, "The fake provider had an internal error", "server_error")
            if model == "fake-malformed":
                return self._send(200, b"<html>not json</html>", "application/json")
            content = _chat_content(model, nth)
            reported = None if model == "fake-no-model" else f"{model}-resolved"
            if body.get("stream") is True:
                return self._stream(content, reported, model == "fake-reasoning")
            answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": content}}]}
            if reported:
                answer["model"] = reported
            self._json(200, answer)

        def _stream(self, content, reported, reasoning):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            deltas = [{"reasoning_content": part} for part in _pieces(REASONING)] if reasoning else []
            deltas = [{"role": "assistant", "content": ""}] + deltas
            deltas += [{"content": part} for part in _pieces(content)]
            for delta in deltas:
                self._event(_stream_record(reported, delta, None))
            self._event(_stream_record(reported, {}, "stop"))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, record):
            self.wfile.write(b"data: " + json.dumps(record).encode() + b"\n\n")
            self.wfile.flush()

        def _image(self, body, nth):
            model = body["model"]
            if model == "fake-slow-image":
                time.sleep(fake.slow)
            if model == "fake-error-500":
                return self._error(500, "The fake provider had an internal error", "server_error")
            if model == "fake-no-image":
                return self._json(200, {"created": int(time.time()), "data": []})
            if model == "fake-bad-image":
                item = {"b64_json": base64.b64encode(b"these bytes are no image").decode()}
            elif model == "fake-url-png":
                name = f"image-{nth}.png"
                fake._files[name] = _image(body.get("size"), "PNG")
                item = {"url": f"http://127.0.0.1:{fake.port}/files/{name}"}
            else:
                kind = "WEBP" if model == "fake-webp" else "PNG"
                item = {"b64_json": base64.b64encode(_image(body.get("size"), kind)).decode()}
            self._json(200, {"created": int(time.time()), "data": [item]})

        # -- HTTP ----------------------------------------------------------------------

        def _authorized(self):
            if fake.key is None:
                return True
            sent = self.headers.get("Authorization", "")
            if sent == f"Bearer {fake.key}":
                return True
            shown = sent.removeprefix("Bearer ")
            # OpenAI's wording, partial key included: callers must not pass it on.
            self._error(401, f"Incorrect API key provided: {shown[:3]}***{shown[-4:]}. You can "
                             "find your API key at https://platform.openai.com/account/api-keys.",
                        "invalid_api_key")
            return False

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                return None
            return body if isinstance(body, dict) else None

        def _error(self, status, message, code=None):
            self._json(status, {"error": {"message": message, "type": "invalid_request_error",
                                          "param": None, "code": code}})

        def _json(self, status, payload):
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status, data, content_type):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _chat_content(model, nth):
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
        ideas = [{"title": f"Idea {i}", "description": f"What idea {i} is about."}
                 for i in range(1, count + 1)]
        return json.dumps({"ideas": ideas})
    if model == "fake-slow":
        return json.dumps({"slow": True})
    return json.dumps(VALID_JSON)


def _pieces(text, size=7):
    return [text[i:i + size] for i in range(0, len(text), size)]


def _stream_record(model, delta, finish_reason):
    record = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
              "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m devtools.fake_openai",
                                     description="A fake OpenAI-compatible provider.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve until interrupted")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--key", default=None, help="require Authorization: Bearer KEY")
    serve.add_argument("--slow", type=float, default=0.5, help="delay of the slow scenarios (s)")
    args = parser.parse_args(argv)
    fake = FakeOpenAI(key=args.key, slow=args.slow, host=args.host, port=args.port)
    print(f"fake OpenAI-compatible provider on http://{args.host}:{fake.port}/v1", flush=True)
    fake.serve_until_interrupted()


if __name__ == "__main__":
    main()
