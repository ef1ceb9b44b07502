"""One log line per request to stderr: method, path, status, duration and a
request id. The query string is left out on purpose: it may carry tokens. The path
is the client's: the log's formatter (app.common.logsetup) escapes its control
characters, so a `%0a` in it cannot start a line of its own."""

import logging
import re
import time
import uuid

from flask import Flask, Response, g, request

from app.common.logsetup import configure_logging

log = logging.getLogger("bundle.request")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def request_id(incoming: str) -> str:
    """The id a request is logged under: the client's X-Request-Id when it is sane."""
    return incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex


def log_line(method: str, path: str, status: int, started: float, identifier: str) -> None:
    """The request's line; `started` is its time.monotonic() at arrival, `identifier`
    its request_id()."""
    log.info("%s %s %s %.1fms id=%s", method, path, status, (time.monotonic() - started) * 1000, identifier)


def register(app: Flask) -> None:
    configure_logging()

    @app.before_request
    def start_timer() -> None:
        g.request_started = time.monotonic()
        g.request_id = request_id(request.headers.get("X-Request-Id", ""))

    @app.after_request
    def log_request(response: Response) -> Response:
        # For a stream this is the time to its first byte; the stream logs its end itself.
        identifier = g.get("request_id", "-")
        response.headers["X-Request-Id"] = identifier
        log_line(
            request.method, request.path, response.status_code, g.get("request_started", time.monotonic()), identifier
        )
        return response
