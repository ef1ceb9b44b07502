"""AI text and image generation through an OpenAI-compatible provider (no Flask here).

Protocol, through `requests` (cooperative under the gunicorn gevent worker's patching):
- text: POST {base}/chat/completions {model, messages, stream?, response_format?}; with an
  `on_chunk` callback the call streams (`stream: true`, SSE `data:` records ending with
  `data: [DONE]`) and every content delta is handed to the callback as it arrives.
- images: POST {base}/images/generations {model, prompt, n: 1, size, response_format:
  "b64_json"}; an answer with only a `url` is fetched within the same deadline and size cap.
  The image is opened with Pillow (PNG, JPEG or WebP only) and converted to WebP.

Rules (spec 002, issue 3):
- Every call takes a slot of a bounded concurrency limit first; the wait is real, measured
  (`queueMs`) and counts toward the call's time-out. One deadline covers queue, attempts,
  repair and download; passing it is GenerationFailed(504).
- JSON mode: strict parse; invalid → local repair (json_output: JSON the model wrote, never
  structure made from prose) → still invalid → one rerun of the generation (the same steps)
  → still invalid → GenerationFailed(502). Nothing is made up, and `kind == "ideas"` must be
  `{ideas: [...]}` with 5 or 6 entries each with a non-empty string title and description,
  checked on the whole batch (nothing trimmed).
- Provider HTTP errors, unreachable providers and malformed answers are GenerationFailed(502)
  with a message that names the provider's status and its own (redacted) words but never the
  API key. The HTTP itself (deadline, kept-alive pool of the base URL, reading, failures) is
  app.common.provider_http's, and the reading of chat answers (whole or streamed)
  app.common.openai_chat's; this module words their failures.
- CPU work (large JSON parses, json-repair on big outputs, Pillow) runs in gevent's threadpool
  through app.common.offload.blocking so the worker's loop keeps serving.

Image sizes (`SIZES`): the exact ratio on a 1024-pixel long side, multiples of 64:
1:1 → 1024x1024, 3:4 → 768x1024, 4:3 → 1024x768, 9:16 → 576x1024, 16:9 → 1024x576.
Providers with a fixed list of sizes (OpenAI's dall-e-3 / gpt-image-1 take only 1024x1024 and
one portrait and one landscape size) can be given their own mapping with `sizes=`.
"""

import base64
import binascii
import io
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import gevent
import gevent.lock
import gevent.monkey
from PIL import Image
from prometheus_client import Counter, Histogram

from app.common import openai_chat
from app.common.config import ConfigError, env_int, env_seconds, env_str
from app.common.offload import blocking
from app.common.provider_http import (
    Deadline,
    DeadlinePassed,
    Exchange,
    ProviderFailed,
    Wording,
    same_origin,
)
from app.wizard import json_output

log = logging.getLogger("bundle.wizard.generation")

SIZES = {"1:1": "1024x1024", "3:4": "768x1024", "4:3": "1024x768", "9:16": "576x1024", "16:9": "1024x576"}

DEFAULT_IMAGE_SYSTEM = (
    "Create a single safe-for-work illustration suitable for a general audience. "
    "No nudity, sexual content, gore, graphic violence, hate symbols, or self-harm. "
    "Do not depict real, identifiable people or copyrighted characters, logos or trademarks. "
    "Do not render any text, captions, letters or watermarks in the image. "
    "If the subject asks for anything unsafe, depict a harmless, neutral interpretation instead."
)

HOST_DEFAULT = "host default"
UNKNOWN_MODEL = "unknown"
IDEAS_BATCH = (5, 6)

TEXT_ANSWER_LIMIT = 8 * 1024 * 1024  # a chat answer; far above any useful completion
IMAGE_ANSWER_LIMIT = 64 * 1024 * 1024  # a JSON answer carrying a base64 image
IMAGE_DOWNLOAD_LIMIT = 32 * 1024 * 1024  # an image fetched from the answer's `url`
MAX_IMAGE_PIXELS = 40_000_000  # refuse decompression bombs before decoding
OFFLOAD_OVER = 256 * 1024  # parse/repair larger texts off the loop
CONNECT_TIMEOUT = 10.0
REDIRECTS = 30  # requests' own limit, which the wizard's calls had
KEY_SHAPE = re.compile(r"[!-~]{1,512}")  # a key goes into a header: printable ASCII only

# Metrics (/metrics). `type`: text or image. A call's outcome: ok, invalid (JSON output still
# invalid after a repair and a rerun), provider_error (the provider failed or answered
# something unusable), timeout (the call's deadline passed, in the queue or at the provider),
# error (anything else: a bug).
TYPES = ("text", "image")
OUTCOMES = ("ok", "invalid", "provider_error", "timeout", "error")
CALLS = Counter(
    "bundle_wizard_generations_total",
    "Generation calls by type (text, image) and outcome (ok, invalid, provider_error, timeout, error)",
    ["type", "outcome"],
)
PROVIDER_SECONDS = Histogram(
    "bundle_wizard_provider_request_duration_seconds",
    "Time of each request to the AI provider (an attempt of a text call, an image call's request and download)",
    ["type"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
)
REPAIRS = Counter(
    "bundle_wizard_json_repairs_total",
    "Local repairs of a model's invalid JSON output, by result (repaired, still_invalid)",
    ["result"],
)
RERUNS = Counter("bundle_wizard_json_reruns_total", "Generations run again because their JSON output stayed invalid")
for _type in TYPES:  # every series from the start, at 0
    PROVIDER_SECONDS.labels(_type)
    for _outcome in OUTCOMES:
        CALLS.labels(_type, _outcome)
for _result in ("repaired", "still_invalid"):
    REPAIRS.labels(_result)


class GenerationUnavailable(Exception):
    """No provider (or no model of that role) is configured."""


class GenerationFailed(ProviderFailed):
    """The generation failed: `status` 502 (provider or output failure) or 504 (time-out),
    `message` safe to show, `timing` the JSON-mode timing dict (None for other calls)."""

    def __init__(self, status, message, timing=None, outcome=None):
        super().__init__(status, message)
        self.timing = timing
        # For the metrics: "invalid" (the output), else a 504 is a time-out, a 502 the provider's.
        self.outcome = outcome or ("timeout" if status == 504 else "provider_error")


class _Wording(Wording):
    """How the wizard words a provider's failures (every time-out names the whole call's)."""

    error: type[ProviderFailed] = GenerationFailed
    timed_out = connect_timed_out = "the AI provider did not answer within {seconds:g} s"
    unreachable = "{name} cannot be reached ({cause})"
    call_failed = "the request to {name} failed ({kind})"
    cut_off = "the AI provider's answer was cut off ({kind})"
    too_large = "{answer} is larger than the size cap of {limit} bytes"
    not_json = "the AI provider answered with malformed JSON"
    # The chat answer's own failures (app.common.openai_chat): a stream must be whole.
    no_message = "{name}'s answer has no message"
    no_text = "{name}'s answer has no text content"
    model_refused = "the model refused: {refusal}"
    stream_not_json = "{name} streamed malformed JSON"
    stream_not_object = "{name} streamed an unexpected record"
    stream_bad_choice = None  # a record without a chunk's choice carries nothing: read on
    stream_error = "{name} reported an error mid-stream: {detail}"
    stream_too_large = "{name}'s answer is larger than the size cap"
    stream_incomplete = "{name}'s stream ended before it was complete"
    whole_when_not_streamed = True


class _DownloadWording(_Wording):
    def refused(self, code, exchange):
        return self.fail(502, "{name} answered HTTP {code}", code=code)


@dataclass
class TextOutcome:
    content: str
    timing: dict | None
    resolved_model: str
    requested_model: str


@dataclass
class ImageOutcome:
    webp: bytes
    provider: str
    model: str


class _InvalidOutput(Exception):
    """The model's output is not acceptable JSON for this call."""


class Generator:
    def __init__(
        self,
        *,
        base_url,
        api_key,
        text_model,
        image_model,
        provider="openai",
        timeout=60.0,
        concurrency=4,
        image_system=None,
        sizes=None,
        json_response_format=True,
    ):
        self.base_url = (base_url or "").rstrip("/")
        self._api_key = api_key or ""
        self.text_model = text_model or ""
        self.image_model = image_model or ""
        self.provider = provider or "openai"
        self.timeout = float(timeout)
        self.concurrency = int(concurrency)
        self.image_system = image_system or DEFAULT_IMAGE_SYSTEM
        self.sizes = dict(sizes or SIZES)
        # OpenAI-style JSON mode; some compatible servers reject the field, hence the switch.
        self.json_response_format = json_response_format
        self._slots = _new_slots(self.concurrency)
        self._words = _Wording("the AI provider", show_text=True, api_key=self._api_key)
        self._download_words = _DownloadWording("the image download", answer="the generated image")

    @classmethod
    def from_env(cls):
        base_url = env_str("WIZ_AI_BASE_URL")
        if base_url and urlsplit(base_url).scheme not in ("http", "https"):
            raise ConfigError("WIZ_AI_BASE_URL must be an http:// or https:// URL")
        api_key = env_str("WIZ_AI_API_KEY")
        if api_key and not KEY_SHAPE.fullmatch(api_key):
            # Never echo the value: it is a secret.
            raise ConfigError("WIZ_AI_API_KEY has characters that an API key cannot have")
        return cls(
            base_url=base_url,
            api_key=api_key,
            text_model=env_str("WIZ_TEXT_MODEL"),
            image_model=env_str("WIZ_IMAGE_MODEL"),
            provider=env_str("WIZ_AI_PROVIDER", "openai"),
            timeout=env_seconds("WIZ_AI_TIMEOUT", 60.0),
            concurrency=env_int("WIZ_AI_CONCURRENCY", 4, minimum=1, maximum=256),
        )

    @property
    def available_text(self):
        return bool(self.base_url and self.text_model)

    @property
    def available_image(self):
        return bool(self.base_url and self.image_model)

    # -- text ----------------------------------------------------------------------

    def text(
        self,
        messages,
        *,
        system=None,
        json_mode=False,
        kind=None,
        model=None,
        on_chunk=None,
        on_phase=None,
        on_reasoning=None,
    ):
        """One chat completion. `messages` is a list of {role, content} (ValueError otherwise).
        `on_chunk(text)` gets content deltas as they stream, `on_reasoning(text)` the
        reasoning deltas some providers stream beside them, `on_phase(name, detail)` the
        phases queued, started, repairing, retrying, done and failed."""
        if not self.available_text:
            raise GenerationUnavailable("AI text generation is not configured (set WIZ_AI_BASE_URL and WIZ_TEXT_MODEL)")
        body = {"model": model or self.text_model, "messages": _chat_messages(messages, system)}
        if json_mode and self.json_response_format:
            body["response_format"] = {"type": "json_object"}
        phase = _Phases(on_phase)
        timing = {
            "requestedModel": model or HOST_DEFAULT,
            "resolvedModel": UNKNOWN_MODEL,
            "queueMs": 0,
            "attemptMs": 0,
            "repairMs": 0,
            "totalMs": 0,
            "attempts": 0,
        }
        clock = Deadline(self.timeout)
        try:
            with _Counted("text"), _Guard(clock, self._words), self._slot(clock, timing, phase):
                if json_mode:
                    content = self._json_attempts(body, kind, clock, timing, phase, on_chunk, on_reasoning)
                else:
                    content = self._attempt(body, clock, timing, phase, on_chunk, on_reasoning).content
        except GenerationFailed as exc:
            timing["totalMs"] = clock.elapsed_ms()
            exc.timing = dict(timing) if json_mode else None
            phase("failed", {"status": exc.status, "message": exc.message})
            raise
        timing["totalMs"] = clock.elapsed_ms()
        phase("done", {"totalMs": timing["totalMs"], "attempts": timing["attempts"]})
        return TextOutcome(
            content=content,
            timing=dict(timing) if json_mode else None,
            resolved_model=timing["resolvedModel"],
            requested_model=timing["requestedModel"],
        )

    def _json_attempts(self, body, kind, clock, timing, phase, on_chunk, on_reasoning):
        """The first generation and at most one rerun; the accepted JSON, serialized."""
        for attempt in (1, 2):
            if attempt == 2:
                RERUNS.inc()
                phase("retrying", {"attempt": 2})
            answer = self._attempt(body, clock, timing, phase, on_chunk, on_reasoning)
            value = self._accept(answer.content, kind, clock, timing, phase)
            if value is not None:
                return json.dumps(value, ensure_ascii=False)
        raise GenerationFailed(
            502,
            "the model's output was not valid JSON"
            + (" with 5 or 6 ideas" if kind == "ideas" else "")
            + " after a local repair and one rerun",
            outcome="invalid",
        )

    def _accept(self, content, kind, clock, timing, phase):
        """The parsed value if `content` is acceptable, as is or after a local repair; None
        otherwise."""
        try:
            return _checked(_parse_strict(content), kind)
        except _InvalidOutput:
            pass
        phase("repairing", {"attempt": timing["attempts"]})
        started = time.monotonic()
        try:
            value = _checked(blocking(json_output.repair, content), kind)
        except _InvalidOutput:
            REPAIRS.labels("still_invalid").inc()
            return None
        finally:
            timing["repairMs"] += _ms(time.monotonic() - started)
        REPAIRS.labels("repaired").inc()
        return value

    def _attempt(self, body, clock, timing, phase, on_chunk, on_reasoning):
        """One chat completion, counted in `timing`, streaming when a callback wants chunks."""
        timing["attempts"] += 1
        phase("started", {"attempt": timing["attempts"], "queueMs": timing["queueMs"]})
        started = time.monotonic()
        try:
            if on_chunk is None and on_reasoning is None:
                answer = self._complete(body, clock)
            else:
                answer = self._stream(body, clock, _Relay(on_chunk), _Relay(on_reasoning))
        finally:
            took = time.monotonic() - started
            timing["attemptMs"] += _ms(took)
            PROVIDER_SECONDS.labels("text").observe(took)
        # The final attempt's report decides; an answer without a model says nothing.
        timing["resolvedModel"] = answer.model or UNKNOWN_MODEL
        return answer

    def _complete(self, body, clock):
        return openai_chat.complete(self._chat_post(clock), self._words, body, limit=TEXT_ANSWER_LIMIT, loads=_loads)

    def _stream(self, body, clock, relay, reasoning):
        """Collects a streamed completion: content deltas go to `relay` in order."""
        parts, model = [], None
        for delta in openai_chat.stream(
            self._chat_post(clock), self._words, body, limit=TEXT_ANSWER_LIMIT, loads=_loads
        ):
            model = delta.model or model
            if delta.reasoning:
                reasoning(delta.reasoning)
            if delta.content:
                parts.append(delta.content)
                relay(delta.content)
        return openai_chat.ChatAnswer("".join(parts), model)

    def _chat_post(self, clock):
        return lambda body: self._post(clock, openai_chat.PATH, body)

    # -- images --------------------------------------------------------------------

    def image(self, subject, aspect_ratio, *, system=None, model=None, on_phase=None):
        """One generated image as WebP bytes. ValueError for an empty subject or an aspect
        ratio outside SIZES."""
        if not self.available_image:
            raise GenerationUnavailable(
                "AI image generation is not configured (set WIZ_AI_BASE_URL and WIZ_IMAGE_MODEL)"
            )
        if not isinstance(subject, str) or not subject.strip():
            raise ValueError("the image subject must be a non-empty string")
        if aspect_ratio not in self.sizes:
            raise ValueError(f"aspectRatio must be one of {', '.join(self.sizes)}")
        model = model or self.image_model
        body = {
            "model": model,
            "prompt": _image_prompt(system or self.image_system, subject),
            "n": 1,
            "size": self.sizes[aspect_ratio],
        }
        if not model.startswith("gpt-image"):
            # OpenAI's gpt-image models always answer base64 and refuse this field.
            body["response_format"] = "b64_json"
        phase = _Phases(on_phase)
        clock = Deadline(self.timeout)
        timing = {"queueMs": 0}
        try:
            with _Counted("image"), _Guard(clock, self._words), self._slot(clock, timing, phase):
                phase("started", {"queueMs": timing["queueMs"]})
                started = time.monotonic()
                try:
                    raw = self._image_bytes(body, clock)
                finally:
                    PROVIDER_SECONDS.labels("image").observe(time.monotonic() - started)
                phase("converting", {"bytes": len(raw)})
                webp = blocking(_to_webp, raw)
        except GenerationFailed as exc:
            phase("failed", {"status": exc.status, "message": exc.message})
            raise
        phase("done", {"totalMs": clock.elapsed_ms(), "bytes": len(webp)})
        return ImageOutcome(webp=webp, provider=self.provider, model=model)

    def _image_bytes(self, body, clock):
        with self._post(clock, "/images/generations", body) as exchange:
            payload = exchange.json(IMAGE_ANSWER_LIMIT, loads=_loads)
        item = _first_image(payload)
        if isinstance(item.get("b64_json"), str) and item["b64_json"]:
            return _b64(item["b64_json"])
        url = item.get("url")
        if isinstance(url, str) and url.startswith("data:"):
            return _b64(url.partition(",")[2])
        if isinstance(url, str) and urlsplit(url).scheme in ("http", "https"):
            return self._download(clock, url)
        raise GenerationFailed(502, "the AI provider's answer carries no image")

    def _download(self, clock, url):
        headers = {"Accept": "image/*"}
        if same_origin(url, self.base_url) and self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"  # the key stays with its origin
        with self._exchange(clock, self._download_words).open("GET", url, headers, redirects=REDIRECTS) as exchange:
            declared = exchange.header("Content-Length").strip()
            if declared.isdigit() and int(declared) > IMAGE_DOWNLOAD_LIMIT:
                raise GenerationFailed(502, "the generated image is larger than the size cap")
            return exchange.body(IMAGE_DOWNLOAD_LIMIT)

    # -- shared ----------------------------------------------------------------------

    def _slot(self, clock, timing, phase):
        return _Slot(self._slots, clock, timing, phase, self.concurrency)

    def _exchange(self, clock, words):
        # As requests' Session does (the wizard's calls always have): the environment's
        # proxies and CA bundle, and redirects followed.
        return Exchange(words, clock, self.base_url, CONNECT_TIMEOUT, pool="wizard", environment=True)

    def _post(self, clock, path, body):
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if body.get("stream"):
            headers["Accept"] = "text/event-stream"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return self._exchange(clock, self._words).open("POST", self.base_url + path, headers, body, redirects=REDIRECTS)


# -- the deadline and the queue ----------------------------------------------------------


class _Guard:
    """Where a time-out outside a provider exchange (the deadline passed in the queue, or
    between steps) becomes GenerationFailed(504); inside one, the transport words it the same.
    Under the gevent worker it also runs a gevent.Timeout over the whole call (queue, attempts,
    repair, download), which interrupts any blocked socket operation; unpatched threads
    (tests, CLI) rely on the socket time-outs and the checks between reads instead."""

    def __init__(self, clock, words):
        self.clock, self.words = clock, words
        self.timer = None
        if gevent.monkey.is_module_patched("socket"):
            self.timer = gevent.Timeout(clock.seconds)  # a BaseException: no `except Exception` eats it

    def __enter__(self):
        if self.timer is not None:
            self.timer.start()
        return self

    def __exit__(self, kind, exc, tb):
        if self.timer is not None:
            self.timer.close()
        if (exc is not None and exc is self.timer) or isinstance(exc, DeadlinePassed):
            raise self.words.too_late(self.clock) from None
        return False


class _Counted:
    """Counts a call in CALLS by its outcome (outside _Guard: a time-out is a GenerationFailed here)."""

    def __init__(self, call_type):
        self.call_type = call_type

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            outcome = "ok"
        elif isinstance(exc, GenerationFailed):
            outcome = exc.outcome
        else:
            outcome = "error"
        CALLS.labels(self.call_type, outcome).inc()
        return False


class _Slot:
    """A place among `concurrency` calls at once. The wait is measured into
    timing["queueMs"] and bounded by the call's deadline."""

    def __init__(self, slots, clock, timing, phase, concurrency):
        self.slots, self.clock, self.timing, self.phase = slots, clock, timing, phase
        self.concurrency = concurrency

    def __enter__(self):
        self.phase("queued", {"concurrency": self.concurrency})
        started = time.monotonic()
        try:
            acquired = self.slots.acquire(timeout=self.clock.remaining())
        finally:
            self.timing["queueMs"] = _ms(time.monotonic() - started)
        if not acquired:
            raise GenerationFailed(
                504, f"no generation slot became free within {self.clock.seconds:g} s ({self.concurrency} at once)"
            )
        return self

    def __exit__(self, *exc):
        self.slots.release()
        return False


def _new_slots(concurrency):
    # gevent's semaphore is cooperative but belongs to one thread's hub; the gunicorn
    # gevent worker patches threading, while plain threads (tests, CLI) need a thread one.
    if gevent.monkey.is_module_patched("threading"):
        return gevent.lock.BoundedSemaphore(concurrency)
    return threading.BoundedSemaphore(concurrency)


# -- reading answers -----------------------------------------------------------------


def _loads(data):
    return blocking(json.loads, data) if len(data) > OFFLOAD_OVER else json.loads(data)


def _first_image(payload):
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise GenerationFailed(502, "the AI provider's answer carries no image")
    return data[0]


# -- JSON output -----------------------------------------------------------------------


def _parse_strict(content):
    try:
        if len(content) > OFFLOAD_OVER:
            return blocking(json.loads, content)
        return json.loads(content)
    except ValueError:
        raise _InvalidOutput() from None


def _checked(value, kind):
    """`value` if it is acceptable JSON-mode output; _InvalidOutput otherwise."""
    if kind == "ideas" and not _valid_ideas(value):
        raise _InvalidOutput()
    if not isinstance(value, (dict, list)):
        raise _InvalidOutput()
    return value


def _valid_ideas(value):
    if not isinstance(value, dict) or not isinstance(value.get("ideas"), list):
        return False
    ideas = value["ideas"]
    return len(ideas) in IDEAS_BATCH and all(
        isinstance(idea, dict) and _filled(idea.get("title")) and _filled(idea.get("description")) for idea in ideas
    )


def _filled(text):
    return isinstance(text, str) and bool(text.strip())


# -- requests and images -------------------------------------------------------------


def _chat_messages(messages, system):
    if not isinstance(messages, list):
        raise ValueError("messages must be a list of {role, content}")
    out = []
    if isinstance(system, str) and system.strip():
        out.append({"role": "system", "content": system})
    for message in messages:
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError("messages must be a list of {role, content} with string values")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _image_prompt(system, subject):
    # The images API has no system role: the guidance goes first in the prompt.
    return f"{system.strip()}\n\nSubject: {subject.strip()}"


def _b64(text):
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise GenerationFailed(502, "the AI provider's image is not valid base64") from None


def _to_webp(raw):
    """WebP bytes of a PNG, JPEG or WebP image (runs in the threadpool)."""
    try:
        with Image.open(io.BytesIO(raw)) as img:
            if img.format not in ("PNG", "JPEG", "WEBP"):
                raise GenerationFailed(502, f"the AI provider's image is {img.format}, not PNG, JPEG or WebP")
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise GenerationFailed(502, "the AI provider's image has too many pixels")
            img.load()
            if img.format == "WEBP":
                return raw  # decoded fine: keep the provider's encoding, no second loss
            mode = "RGBA" if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info else "RGB"
            out = io.BytesIO()
            img.convert(mode).save(out, "WEBP", quality=90, method=4)
            return out.getvalue()
    except GenerationFailed:
        raise
    except Exception:  # Pillow signals a bad image through many exception types
        raise GenerationFailed(502, "the AI provider's image could not be decoded") from None


# -- small helpers -----------------------------------------------------------------------


def _ms(seconds):
    return int(round(seconds * 1000))


class _Phases:
    """Calls on_phase(name, detail); a failing callback (a relay) never fails the call."""

    def __init__(self, callback):
        self.callback = callback

    def __call__(self, name, detail=None):
        if self.callback is not None:
            try:
                self.callback(name, detail or {})
            except Exception:
                log.warning("the generation phase callback failed", exc_info=True)


class _Relay:
    """Calls a chunk callback; a failing callback never fails the call."""

    def __init__(self, callback):
        self.callback = callback

    def __call__(self, text):
        if self.callback is not None and text:
            try:
                self.callback(text)
            except Exception:
                log.warning("the generation chunk callback failed", exc_info=True)
