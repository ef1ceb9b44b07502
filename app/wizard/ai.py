"""AI text and image generation routes, their logs and timings, and the live relays
of a generation's thoughts and phases.

The provider calls themselves are in `generation`; here each call is validated,
logged (`llm_logs` for successes, `llm_timings` for every JSON call) and answered.
Thoughts and phases go through the broker only: bounded in memory, never stored.
"""

import json
import re

from flask import Blueprint, current_app, jsonify
from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.common import sse
from app.common.body import StrictBoolean, json_object, validated
from app.common.broker import broker
from app.common.db import write_transaction
from app.common.failures import ApiError, Invalid, Unavailable
from app.wizard import cache, events, identity, uploads
from app.wizard.generation import SIZES, GenerationFailed
from app.wizard.models import LlmLog, LlmTiming, database

bp = Blueprint("ai", __name__)
# Views that take no database connection per request (app.common.db.bind_to_requests):
# the streams of thoughts and phases read none.
NO_CONNECTION = frozenset({"ai_thoughts", "ai_phases"})
BODY_LIMIT = 512 * 1024
_TOKEN = r"^[A-Za-z0-9_-]{8,100}$"
_TAB = re.compile(_TOKEN)
ROLES = ("system", "user", "assistant")


class MessageSchema(Schema):
    role = fields.String(required=True, validate=validate.OneOf(ROLES))
    content = fields.String(required=True, validate=validate.Length(max=200_000))


class TextSchema(Schema):
    system = fields.String(load_default=None, validate=validate.Length(max=50_000))
    messages = fields.List(fields.Nested(MessageSchema), required=True, validate=validate.Length(min=1, max=200))
    json = StrictBoolean(load_default=False)
    kind = fields.String(load_default="", validate=validate.Length(max=100))
    templateKey = fields.String(load_default="", validate=validate.Length(max=200))
    requestId = fields.String(load_default=None, validate=validate.Length(max=100))
    thoughtsTab = fields.String(load_default=None, validate=validate.Regexp(_TOKEN))
    model = fields.String(load_default=None, validate=validate.Length(min=1, max=200))


class ImageSchema(Schema):
    subject = fields.String(required=True, validate=validate.Length(max=2000))
    aspectRatio = fields.String(required=True, validate=validate.OneOf(tuple(SIZES)))
    kind = fields.String(load_default="", validate=validate.Length(max=100))
    system = fields.String(load_default=None, validate=validate.Length(max=8000))
    model = fields.String(load_default=None, validate=validate.Length(min=1, max=200))
    requestId = fields.String(load_default=None, validate=validate.Length(max=100))

    @validates_schema
    def subject_has_words(self, data, **kwargs):
        if not data.get("subject", "").strip():
            raise ValidationError("must not be empty", "subject")


def generator(role):
    """The configured generator, or a 503 that says what to configure: whatever the
    body, a feature without a provider says it is unavailable."""
    gen = current_app.extensions["wizard_generator"]
    if not (gen.available_text if role == "text" else gen.available_image):
        model = "WIZ_TEXT_MODEL" if role == "text" else "WIZ_IMAGE_MODEL"
        raise Unavailable(f"AI {role} generation is not configured on this server (set WIZ_AI_BASE_URL and {model})")
    return gen


def thoughts_topic(who, tab):
    return f"wizard:thoughts:{who.id}:{tab}"


def phases_topic(who):
    return f"wizard:phases:{who.id}"


def _relays(who, body):
    """The callbacks that relay a generation to its tab (thoughts) and identity (phases)."""
    tab, request_id = body["thoughtsTab"], body["requestId"]

    def on_phase(name, detail):
        broker.publish(phases_topic(who), {"requestId": request_id, "phase": name, **detail})

    if not tab:
        return {"on_phase": on_phase}

    def relay(kind):
        return lambda text: broker.publish(thoughts_topic(who, tab), {"requestId": request_id, kind: text})

    return {"on_phase": on_phase, "on_chunk": relay("text"), "on_reasoning": relay("reasoning")}


def _record(rows):
    """Write log and timing rows in one transaction; tell open pages about new logs."""
    with write_transaction(database):
        for model, values in rows:
            model.create(**values)
        changed = cache.bump(*{"llm_logs" for model, _ in rows if model is LlmLog})
    events.announce(changed)


def _timing_row(who, body, timing, outcome, error=None):
    return LlmTiming, {
        "user_id": who.id,
        "kind": body["kind"],
        "template_key": body["templateKey"],
        "requested_model": timing["requestedModel"],
        "resolved_model": timing["resolvedModel"],
        "queue_ms": timing["queueMs"],
        "attempt_ms": timing["attemptMs"],
        "repair_ms": timing["repairMs"],
        "total_ms": timing["totalMs"],
        "attempts": timing["attempts"],
        "outcome": outcome,
        "error": error,
    }


def _release_connection():
    # A generation may take a minute: give the database connection back to the pool
    # meanwhile (the next query takes one again).
    if not database.is_closed():
        database.close()


@bp.post("/api/ai/text")
def ai_text():
    """One chat completion from the configured text model: `{content, timing}` (503 when text generation is off)."""
    who = identity.current()
    gen = generator("text")
    body = validated(TextSchema(), json_object(BODY_LIMIT))
    _release_connection()
    try:
        outcome = gen.text(
            body["messages"],
            system=body["system"],
            json_mode=body["json"],
            kind=body["kind"] or None,
            model=body["model"],
            **_relays(who, body),
        )
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    except GenerationFailed as exc:
        if exc.timing:
            _record([_timing_row(who, body, exc.timing, "failed", exc.message)])
        raise ApiError(exc.status, exc.message) from None
    log_values = {
        "user_id": who.id,
        "data": {
            "type": "text",
            "kind": body["kind"],
            "template_key": body["templateKey"],
            "system": body["system"],
            "messages": json.dumps(body["messages"], ensure_ascii=False),
            "content": outcome.content,
            "timing": outcome.timing,
            "requested_model": outcome.requested_model,
            "resolved_model": outcome.resolved_model,
        },
    }
    rows = [(LlmLog, log_values)]
    if body["json"]:
        rows.append(_timing_row(who, body, outcome.timing, "ok"))
    _record(rows)
    return jsonify({"content": outcome.content, "timing": outcome.timing})


@bp.post("/api/ai/image")
def ai_image():
    """Generate an image of a subject with the configured image model, store it as WebP, and answer its URL."""
    who = identity.current()
    gen = generator("image")
    body = validated(ImageSchema(), json_object(BODY_LIMIT))
    _release_connection()
    relays = _relays(who, {**body, "thoughtsTab": None})
    try:
        outcome = gen.image(
            body["subject"],
            body["aspectRatio"],
            system=body["system"],
            model=body["model"],
            on_phase=relays["on_phase"],
        )
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    except GenerationFailed as exc:
        raise ApiError(exc.status, exc.message) from None
    url = uploads.store(outcome.webp, "webp")
    _record(
        [
            (
                LlmLog,
                {
                    "user_id": who.id,
                    "data": {
                        "type": "image",
                        "kind": body["kind"],
                        "context": body["subject"],
                        "system": body["system"],
                        "url": url,
                        "provider": outcome.provider,
                        "model": outcome.model,
                        "aspect_ratio": body["aspectRatio"],
                    },
                },
            )
        ]
    )
    return jsonify({"url": url, "provider": outcome.provider, "model": outcome.model})


@bp.get("/api/ai/thoughts/<tab>")
def ai_thoughts(tab):
    """The streamed text of the generations that sent this `thoughtsTab`, for the same
    identity only (another identity, or another tab, hears nothing)."""
    if not _TAB.match(tab):
        raise Invalid("thoughtsTab: must be 8 to 100 letters, digits, '-' or '_'")
    return sse.stream_response((), broker.subscribe(thoughts_topic(identity.current(), tab)))


@bp.get("/api/ai/phases")
def ai_phases():
    """Phase changes (queued, started, repairing, retrying, done, failed) of the
    caller's identity's generations."""
    return sse.stream_response((), broker.subscribe(phases_topic(identity.current())))
