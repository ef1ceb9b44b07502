"""Request helpers of the notebook's routes: settings, bodies, query strings."""

from flask import current_app, request
from marshmallow import EXCLUDE
from werkzeug.exceptions import RequestEntityTooLarge

from app.common.body import json_object, read_body, validated
from app.common.failures import ApiError, Invalid, TooLarge


def settings():
    return current_app.config["NOTEBOOK"]


def jobs():
    return current_app.extensions["notebook_jobs"]


def enqueue(command) -> None:
    """Hand a committed command to the worker; 503 when the queue does not take it
    (Redis down: the command is failed then, so its item can be retried later)."""
    if not jobs().enqueue(command):
        raise ApiError(503, "the job queue is unavailable; retry later")


# The notebook's write limits, the same on every route that stores text (sources added
# by form or JSON at /sources and /sources/json, source updates, notes): a body without
# a file is at most NOTEBOOK_MAX_TEXT_BYTES (a multipart form: each text field; its file
# NOTEBOOK_MAX_UPLOAD_BYTES), and the text kept at most NOTEBOOK_MAX_SOURCE_CHARS
# characters (a document's extracted text too: processing.py). Both answer 413.


def _over_text_cap() -> TooLarge:
    return TooLarge(f"the body is larger than the limit of {settings().max_text_bytes} bytes")


def body(schema):
    """The JSON body, validated by `schema` (an instance)."""
    try:
        data = json_object(settings().max_text_bytes)
    except RequestEntityTooLarge:
        raise _over_text_cap() from None
    return validated(schema, data)


def read_text_body() -> None:
    """Read a body that carries no file (an urlencoded form) under the text cap, before
    werkzeug parses it: it would hold such a form whole, with no per-field limit."""
    try:
        read_body(settings().max_text_bytes)
    except RequestEntityTooLarge:
        raise _over_text_cap() from None


def check_text(field: str, text: str | None) -> None:
    """413 unless `text` (stored in `field`) is within the characters a text may have."""
    cap = settings().max_source_chars
    if text is not None and len(text) > cap:
        raise TooLarge(f"{field}: the text has {len(text)} characters, more than the limit of {cap}", field=field)


def query(schema_class):
    """The query string through `schema_class`; unknown parameters (cache busters)
    are left out, known ones are checked."""
    args = request.args.to_dict()
    for name, value in args.items():
        if "\x00" in name or "\x00" in value:
            raise Invalid(f"{name[:40]!r}: must not contain NUL characters", field=name[:40])
    return validated(schema_class(unknown=EXCLUDE), args)
