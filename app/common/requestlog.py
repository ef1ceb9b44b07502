"""One log line per request to stderr: method, path, status, duration and a
request id. The query string is left out on purpose: it may carry tokens."""
import logging
import re
import time
import uuid

from flask import g, request

from app.common.logsetup import configure_logging

log = logging.getLogger("bundle.request")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def register(app):
    configure_logging()

    @app.before_request
    def start_timer():
        g.request_started = time.monotonic()
        incoming = request.headers.get("X-Request-Id", "")
        g.request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex

    @app.after_request
    def log_request(response):
        # For a stream this is the time to its first byte; the stream logs its end itself.
        started = g.get("request_started", time.monotonic())
        duration_ms = (time.monotonic() - started) * 1000
        request_id = g.get("request_id", "-")
        response.headers["X-Request-Id"] = request_id
        log.info("%s %s %s %.1fms id=%s", request.method, request.path,
                 response.status_code, duration_ms, request_id)
        return response
