"""Request bodies: size limits, JSON objects and marshmallow validation.

Every bad body becomes a failure (app.common.failures) with a clear message: 413 over the
limit, 415 for a non-JSON content type, 400 for malformed JSON, JSON nested too deep
(app.common.clientjson), a non-object or a field that fails its schema (the message
names the field).
"""

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from flask import request
from marshmallow import Schema, ValidationError, fields
from werkzeug.exceptions import RequestEntityTooLarge

from app.common.clientjson import TooDeep, loads
from app.common.failures import Invalid, UnsupportedType
from app.common.offload import blocking

# Parsing a body this large runs in the threadpool, off the gevent loop.
_OFFLOAD_PARSE_BYTES = 256 * 1024
T = TypeVar("T")


class Values(Protocol):
    """Where query_int and query_text look a name up: request.args, request.form, headers."""

    def get(self, key: str) -> str | None: ...


def read_body(limit: int) -> bytes:
    """The request body, at most `limit` bytes, else 413 — with or without a declared
    length, and without reading more than one byte past the limit. (werkzeug alone
    refuses a declared length over its maximum, but silently cuts a chunked body at
    it: so it is asked for one byte more, and that byte tells.)"""
    request.max_content_length = limit + 1
    data = request.get_data()
    if len(data) > limit:
        raise RequestEntityTooLarge()
    return data


def json_object(limit: int) -> dict[str, Any]:
    """The request body as a JSON object, at most `limit` bytes."""
    if not request.is_json:
        raise UnsupportedType("the body must be JSON (Content-Type: application/json)")
    raw = read_body(limit)
    try:
        text = raw.decode("utf-8")
        data = blocking(loads, text) if len(raw) > _OFFLOAD_PARSE_BYTES else loads(text)
    except TooDeep as exc:
        raise Invalid(f"the body is {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Invalid("the body must be a JSON object")
    return data


def first_error(messages: object, prefix: str = "") -> tuple[str, str]:
    """The first (field path, message) in marshmallow's nested error dict."""
    if isinstance(messages, dict):
        for key, value in messages.items():
            return first_error(value, f"{prefix}{key}." if key != "_schema" else prefix)
    if isinstance(messages, list) and messages:
        return first_error(messages[0], prefix)
    return prefix.rstrip("."), str(messages)


def validated(schema: Schema, data: Any) -> Any:
    """`data` loaded through `schema`; a failure is a 400 that names the field."""
    try:
        return schema.load(data)
    except ValidationError as exc:
        field, message = first_error(exc.messages)
        text = f"{field}: {message}" if field else message
        raise Invalid(text, field=field or None, fields=exc.messages) from None


def query_int(args: Values, name: str, default: T, minimum: int = 0, maximum: int | None = None) -> int | T:
    """An integer query parameter; anything else is a 400 naming it."""
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise Invalid(f"{name}: must be an integer, got {raw[:40]!r}", field=name) from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise Invalid(f"{name}: must be {bound}", field=name)
    return value


def query_text(args: Values, name: str, maximum: int, required: bool = False) -> str | None:
    """A text query parameter of at most `maximum` characters (None when absent)."""
    value = args.get(name)
    if value is None or value == "":
        if required:
            raise Invalid(f"{name}: is required", field=name)
        return None
    if len(value) > maximum:
        raise Invalid(f"{name}: must be at most {maximum} characters", field=name)
    return value


class StrictBoolean(fields.Boolean):
    """A JSON boolean and nothing else: "yes", 1 or "true" are refused, not guessed."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ValidationError("Not a valid boolean.")
        return value
