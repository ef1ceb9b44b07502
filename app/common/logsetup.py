"""Where every process of the bundle logs: one line a record to stderr (journald in
production). No Flask here: job workers and commands set it up too.

Two forms, chosen by LOG_FORMAT (app.common.config):

- `text` (the default): `<time> <LEVEL> <logger> <message>`. A record's message is
  escaped before it is written: control characters (C0, DEL, C1 such as NEL \\x85),
  the Unicode line and paragraph separators and the invisible format characters that
  reorder or hide text become `\\n`, `\\x85`, `\\u2028`... So a value a client chose (a
  path with %0a, a client error report) can never start a line of its own that looks
  like the service's. Tracebacks, appended after the message, keep their lines.
- `json`: one JSON object per line (JsonFormatter): time (ISO 8601, UTC), level,
  service, logger, message, pid, the request id of the request being answered, the
  fields a record carries (`with_fields`: the request line's method, route, status,
  duration_ms) and the traceback as a string. `json.dumps` with `ensure_ascii` writes
  every character outside printable ASCII as an escape, the same unsafe ones as the
  text form and all others: a line holds one object whatever a client sent.

Two writers that would bypass logging go through it (configure_logging): gevent's hub,
which prints a greenlet's uncaught error as a multi-line traceback on stderr (a record
of logger `bundle.gevent` instead, at ERROR, its traceback in it), and `warnings`
(logging.captureWarnings: records of logger `py.warnings`). Either is then a record
like any other: one object in JSON, an escaped line (a traceback's lines after it) in
text.

The module imports the standard library only (gevent inside configure_logging, which
runs in the app's processes): gunicorn.conf.py loads this file by its path (never
`import app`, which the gevent worker must import after patching) to write gunicorn's
own records in the same JSON (`gunicorn_logconfig`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

# C0 and DEL, C1, zero-width and direction marks, line/paragraph separators, bidi
# embeddings and isolates, the byte-order mark.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# The record attribute that holds a record's structured fields (`with_fields`).
FIELDS = "bundle_fields"
# The record attribute that holds the id of the request a record was made in.
REQUEST_ID = "request_id"


def escape(text: str) -> str:
    """`text` with every character of _UNSAFE written as an escape."""
    return _UNSAFE.sub(
        lambda m: _SHORT.get(m[0]) or (f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}"), text
    )


def with_fields(**fields: object) -> dict[str, object]:
    """`extra=` for a logging call: `fields` become keys of the record's JSON object
    (the text form shows only the message). A `message` among them replaces the
    record's message in JSON: the request line's text names the path, its JSON the route."""
    return {FIELDS: fields}


class EscapingFormatter(logging.Formatter):
    """The text form."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


def text_formatter() -> logging.Formatter:
    return EscapingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")


class JsonFormatter(logging.Formatter):
    """The JSON form: one object per record, on one line, printable ASCII only."""

    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        fields: Mapping[str, object] = getattr(record, FIELDS, None) or {}
        created = time.gmtime(record.created)
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", created) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": fields.get("message", None) or record.getMessage(),
            "pid": record.process,
        }
        request_id = getattr(record, REQUEST_ID, None)
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update((key, value) for key, value in fields.items() if key != "message")
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=True, default=str)


def formatter(log_format: str, service: str | None) -> logging.Formatter:
    """The formatter of `log_format` (`text` or `json`, LOG_FORMAT's values)."""
    return JsonFormatter(service) if log_format == "json" else text_formatter()


def service_of_process() -> str | None:
    """The service this process belongs to: SERVICE (gunicorn, the systemd units), else
    the package of a command run as `python -m app.<service> ...`; None for neither."""
    service = os.environ.get("SERVICE", "").strip()
    if service:
        return service
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    parts = (getattr(spec, "name", None) or "").split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "app" else None


def bundle_handler() -> logging.Handler | None:
    """The handler configure_logging put on the root logger, if it has."""
    return next((h for h in logging.getLogger().handlers if getattr(h, "_bundle", False)), None)


# The logger of the errors gevent's hub reports: a greenlet that raised, a failed callback.
GEVENT_LOGGER = "bundle.gevent"


def _described(context: object) -> str:
    """What failed, as gevent's own line names it less the arguments (a greenlet's
    repr shows its arguments' reprs, which may hold a credential): the type, and the
    function a greenlet runs."""
    function = getattr(context, "_run", None)  # gevent.Greenlet's callable, while it runs
    name = getattr(function, "__qualname__", None)
    return f"{type(context).__name__} {name}" if isinstance(name, str) else type(context).__name__


def _log_hub_error(
    hub: object, context: object, kind: type[BaseException], value: BaseException | None, tb: TracebackType | None
) -> None:
    """gevent.hub.Hub.print_exception as a record: gevent calls it for every error it
    reports (Hub.handle_error, with the exception normalised; not for GreenletExit or
    SystemExit), then goes on as before (a system error still reaches the main greenlet)."""
    logging.getLogger(GEVENT_LOGGER).error(
        "%s failed with %s",
        "the event loop" if context is None else _described(context),
        getattr(kind, "__name__", "an exception"),
        exc_info=None if value is None else (kind, value, tb or value.__traceback__),
    )


def route_gevent_errors() -> None:
    """gevent's hub reports through logging (GEVENT_LOGGER) instead of printing to
    stderr, in every hub of the process (its threads' too)."""
    try:
        from gevent.hub import Hub
    except ImportError:  # pragma: no cover - gevent is a dependency of every service
        return
    Hub.print_exception = _log_hub_error  # type: ignore[assignment,method-assign]


def configure_logging(service: str | None = None) -> None:
    """Records of every logger to stderr at INFO and above, in the form LOG_FORMAT
    names, warnings and gevent's hub errors among them (the module's text); a bad
    LOG_FORMAT raises ConfigError (the start stops with its one line).
    `service`: the `service` of a JSON line (service_of_process() when not given).
    Called again, it keeps its one handler and sets its form anew."""
    from app.common.config import LOG_FORMAT  # here: gunicorn.conf.py loads this file without the app

    chosen = formatter(LOG_FORMAT.read(), service or service_of_process())
    root = logging.getLogger()
    handler = bundle_handler()
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._bundle = True  # type: ignore[attr-defined]  # our mark on the handler
        root.addHandler(handler)
    handler.setFormatter(chosen)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # `warnings` as records of `py.warnings`, not plain stderr
    route_gevent_errors()


def gunicorn_logconfig(service: str) -> dict[str, Any]:
    """gunicorn's `logconfig_dict` for LOG_FORMAT=json: its own records (the arbiter's,
    a worker's boot and exit) as JSON lines on stderr. The root logger is left to the
    app's configure_logging, in each worker."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "root": {"level": "INFO", "handlers": []},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["bundle_json"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": False},
        },
        "handlers": {
            "bundle_json": {"class": "logging.StreamHandler", "formatter": "bundle_json", "stream": "ext://sys.stderr"}
        },
        "formatters": {"bundle_json": {"()": JsonFormatter, "service": service}},
    }
