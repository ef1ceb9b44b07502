"""JSON errors: every failure of a service, 404 and 405 included, answers with that
service's error body and a real non-2xx status.

A service names its body shape with `error_body(status, message, extra)`; routes and
the Flask-free modules below them raise a kind of `Failure` (app.common.failures:
NotFound, Conflict, Invalid, ...) or any werkzeug HTTPException, and never build error
responses by hand. This is the one place where a failure becomes a response.
"""

import logging
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from app.common.db import DATABASE_UNAVAILABLE, unavailable_error
from app.common.failures import Failure

log = logging.getLogger("bundle.errors")
# A service's error body: (status, message, extras such as `field`) -> the JSON object.
ErrorBody = Callable[[int, str, Mapping[str, Any]], dict[str, Any]]


def error_with_field(status: int, message: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The body `{"error": message, "field"?: name}` (the audio and wizard services)."""
    body: dict[str, Any] = {"error": message}
    if extra.get("field"):
        body["field"] = extra["field"]
    return body


def _respond(
    error_body: ErrorBody,
    status: int,
    message: str,
    extra: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    response = jsonify(error_body(status, message, extra or {}))
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _message(exc: HTTPException) -> str:
    """werkzeug's own descriptions are long prose: say it shortly instead."""
    if exc.description and exc.description != type(exc).description:
        return exc.description
    if exc.code == 404:
        return f"not found: {request.path}"
    if exc.code == 405:
        return f"method {request.method} is not allowed on {request.path}"
    if exc.code == 413:
        return "the request body is too large"
    return exc.name.lower()


def register(app: Flask, error_body: ErrorBody) -> None:
    @app.errorhandler(Failure)
    def api_error(exc: Failure) -> Response:
        retry = exc.extra.get("retry_after")
        return _respond(
            error_body, exc.status, exc.message, exc.extra, headers={"Retry-After": str(retry)} if retry else None
        )

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        # Keep headers werkzeug computed, such as Allow on a 405.
        headers = {k: v for k, v in exc.get_headers() if k.lower() in ("allow", "retry-after")}
        return _respond(error_body, exc.code or 500, _message(exc), headers=headers)

    def database_unavailable(exc: Exception) -> Response:
        log.warning("database unavailable: %s", str(exc).strip()[:200])
        return api_error(unavailable_error(exc))

    for error_type in DATABASE_UNAVAILABLE:
        app.register_error_handler(error_type, database_unavailable)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("unhandled error")
        return _respond(error_body, 500, "internal server error")
