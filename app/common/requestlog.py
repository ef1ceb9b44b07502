"""One log line per request to stderr: method, path, status, duration and a
request id (app.common.logsetup writes it as text or JSON, LOG_FORMAT).

What never reaches the line: the query string (it may carry tokens: an app ticket, an
OAuth code), headers and cookies (credentials). In the JSON form the path is not
there either: the route is the matched rule's template (`/api/notes/<note_id>`,
`null` when no rule matched), so one route's lines group together whatever ids
their paths hold.
The text form shows the path, except the value of a URL variable named for a secret
(`<token>`, `<invite_token>`, `<api_key>`, `<signature>`...: SECRET_NAME), which it
shows as its name. No route of the five services puts a secret in its path today
(docs/operations.md#logs says where each one's credentials travel); a route that
does must name its variable so. The path is the client's: the log's formatter
escapes its control characters, so a `%0a` in it cannot start a line of its own.

Records made while a request is answered carry its request id (`request_id` in
JSON)."""

from __future__ import annotations

import functools
import logging
import re
import time
import uuid
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from flask import Flask, Response, current_app, g, has_app_context, has_request_context, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import RequestRedirect

from app.common.logsetup import FIELDS, REQUEST_ID, bundle_handler, configure_logging

log = logging.getLogger("bundle.request")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A URL variable whose value the text line never shows: a word of its name says secret,
# and it does not end in `_id` (`<token_id>`, `<credential_id>` name a record, not a secret).
SECRET_NAME = re.compile(
    r"^(?!.*_ids?$).*(?:^|_)(?:token|secret|key|password|passwd|passphrase|signature|sig|ticket|code|otp|nonce)s?(?:_|$)",
    re.IGNORECASE,
)
# A variable of a rule's template: <name>, <converter:name>, <converter(arguments):name>.
_VARIABLE = re.compile(r"<(?:[A-Za-z_][A-Za-z0-9_]*(?:\([^()]*\))?:)?([A-Za-z_][A-Za-z0-9_]*)>")


def request_id(incoming: str) -> str:
    """The id a request is logged under: the client's X-Request-Id when it is sane."""
    return incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex


@functools.lru_cache(maxsize=1024)
def _has_secret(rule: str) -> bool:
    return any(SECRET_NAME.search(name) for name in _VARIABLE.findall(rule))


def shown_path(path: str, rule: str | None, arguments: Mapping[str, object] | None) -> str:
    """The path as the text line shows it: `path`, or, when the matched `rule` has a
    variable named for a secret, the rule with its variables filled in from
    `arguments` (the view's) except those, which keep their `<name>`."""
    if rule is None or not _has_secret(rule):
        return path
    given = arguments or {}

    def filled(match: re.Match[str]) -> str:
        name = match[1]
        return f"<{name}>" if SECRET_NAME.search(name) or name not in given else str(given[name])

    return _VARIABLE.sub(filled, rule)


def _lookup(method: str, path: str) -> tuple[bool, str | None, Mapping[str, object] | None]:
    """(whether `path` matched a rule as it is, rule, arguments) in the current app's URL
    map. When it did not: the rule it would match with another method (a 405) or once
    redirected (a missing slash), whose secret variables the text line masks all the
    same; else (False, None, None)."""
    if not has_app_context():
        return False, None, None
    adapter = current_app.url_map.bind("localhost")
    for attempt in range(3):
        try:
            rule, arguments = adapter.match(path, method, return_rule=True)
            return attempt == 0, rule.rule, arguments
        except MethodNotAllowed as exc:
            if not exc.valid_methods:
                break
            method = next(iter(exc.valid_methods))
        except RequestRedirect as exc:
            path = unquote(urlsplit(exc.new_url).path)
        except HTTPException:
            break
    return False, None, None


def shown_request_path() -> str:
    """The current request's path as the text line shows it (shown_path of its rule, or
    of the rule it nearly matched)."""
    rule = request.url_rule
    if rule is not None:
        return shown_path(request.path, rule.rule, request.view_args)
    return shown_path(request.path, *_lookup(request.method, request.path)[1:])


def log_line(method: str, path: str, status: int, started: float, identifier: str) -> None:
    """The line of a request answered before Flask routes it (the workspace's apps
    front): its rule is looked up in the app's URL map. `started` is its
    time.monotonic() at arrival, `identifier` its request_id()."""
    matched, rule, arguments = _lookup(method, path)
    _write(method, shown_path(path, rule, arguments), rule if matched else None, status, started, identifier)


def _write(method: str, shown: str, route: str | None, status: int, started: float, identifier: str) -> None:
    """The line; `shown`: the path as the text line shows it (shown_path), `route`: the
    matched rule's template (None when no rule matched)."""
    milliseconds = (time.monotonic() - started) * 1000
    fields = {
        "message": f"{method} {route or '-'} {status} {milliseconds:.1f}ms",
        "method": method,
        "route": route,
        "status": status,
        "duration_ms": round(milliseconds, 1),
    }
    log.info(
        "%s %s %s %.1fms id=%s",
        method,
        shown,
        status,
        milliseconds,
        identifier,
        extra={FIELDS: fields, REQUEST_ID: identifier},
    )


class RequestIdFilter(logging.Filter):
    """Gives a record made while a request is answered that request's id."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, REQUEST_ID) and has_request_context():
            setattr(record, REQUEST_ID, g.get("request_id"))
        return True


def register(app: Flask) -> None:
    configure_logging(app.config.get("SERVICE"))
    handler = bundle_handler()
    if handler is not None and not any(isinstance(f, RequestIdFilter) for f in handler.filters):
        handler.addFilter(RequestIdFilter())

    @app.before_request
    def start_timer() -> None:
        g.request_started = time.monotonic()
        g.request_id = request_id(request.headers.get("X-Request-Id", ""))

    @app.after_request
    def log_request(response: Response) -> Response:
        # For a stream this is the time to its first byte; the stream logs its end itself.
        identifier = g.get("request_id", "-")
        response.headers["X-Request-Id"] = identifier
        rule = request.url_rule
        _write(
            request.method,
            shown_request_path(),
            None if rule is None else rule.rule,
            response.status_code,
            g.get("request_started", time.monotonic()),
            identifier,
        )
        return response
