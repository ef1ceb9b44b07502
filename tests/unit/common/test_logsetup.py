"""The log's two forms (app.common.logsetup) and the request line (app.common.requestlog),
in process: the JSON object's fields, a traceback inside it on one line, every unsafe
character escaped in both forms, LOG_FORMAT's values, and what a request line never
holds (the query string, headers, the value of a URL variable named for a secret;
the path in JSON), and what would bypass logging (a greenlet's uncaught error, a
warning) as records. The same against every service under gunicorn:
tests/common/test_request_logs.py."""

import io
import json
import logging
import re
import time
from datetime import UTC, datetime

import pytest
from flask import Flask

from app.common import logsetup, requestlog, sse
from app.common.broker import SubscriptionClosed
from app.common.cli import CommandLine
from app.common.config import ConfigError

SECRET = "Sekret-0123456789"
# Every character the text form escapes (logsetup._UNSAFE: all in the BMP), as one string.
UNSAFE = "".join(chr(c) for c in range(0x10000) if logsetup._UNSAFE.match(chr(c)))


def record(message="hello %s", args=("there",), exc_info=None, **extra):
    made = logging.LogRecord("bundle.test", logging.WARNING, __file__, 1, message, args, exc_info)
    made.__dict__.update(extra)
    return made


def as_json(made, service="decks"):
    line = logsetup.JsonFormatter(service).format(made)
    assert "\n" not in line and line.isascii() and line.isprintable(), line
    return json.loads(line)


def test_a_json_line_has_time_level_service_logger_message_and_pid():
    entry = as_json(record())
    assert list(entry) == ["time", "level", "service", "logger", "message", "pid"]
    assert entry["level"] == "WARNING" and entry["service"] == "decks" and entry["logger"] == "bundle.test"
    assert entry["message"] == "hello there" and isinstance(entry["pid"], int)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"]), entry["time"]
    when = datetime.fromisoformat(entry["time"])
    assert when.tzinfo == UTC and abs(when.timestamp() - time.time()) < 60


def test_fields_join_the_object_and_a_message_among_them_replaces_the_text_one():
    fields = logsetup.with_fields(message="GET /notes/<note_id> 200", route="/notes/<note_id>", status=200)
    entry = as_json(record("GET /notes/42 200", (), **fields, request_id="abc"))
    assert entry["message"] == "GET /notes/<note_id> 200"
    assert (entry["request_id"], entry["route"], entry["status"]) == ("abc", "/notes/<note_id>", 200)
    assert "/notes/42" not in json.dumps(entry)


def test_a_traceback_is_a_field_of_the_one_line():
    try:
        raise ValueError("broken\nFAKE line")
    except ValueError:
        import sys

        entry = as_json(record("it failed", (), exc_info=sys.exc_info()))
    assert entry["message"] == "it failed"
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("ValueError: broken\nFAKE line")


@pytest.mark.parametrize("form", ["text", "json"])
def test_every_unsafe_character_is_escaped_in_both_forms(form):
    message = "".join(f"{c}FAKE" for c in UNSAFE)
    assert len(UNSAFE) == 88  # C0, DEL, C1, the separators, the marks and isolates, BOM
    made = record("client said %s", (message,))
    if form == "json":
        line = logsetup.JsonFormatter("wizard").format(made)
        assert json.loads(line)["message"] == f"client said {message}"  # escaped, not lost
    else:
        line = logsetup.text_formatter().format(made)
    assert not logsetup._UNSAFE.search(line) and len(line.splitlines()) == 1
    assert "\\u2028FAKE" in line and ("\\u0085FAKE" if form == "json" else "\\x85FAKE") in line


@pytest.fixture
def bundle_log(monkeypatch):
    """The bundle's handler on the root logger, writing to a StringIO; the root
    logger's handlers and level as they were afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.delenv("LOG_FORMAT", raising=False)
    logsetup.configure_logging("decks")
    stream = io.StringIO()
    previous = logsetup.bundle_handler().setStream(stream)
    yield stream
    handler = logsetup.bundle_handler()
    handler.setStream(previous)
    handler.setFormatter(logsetup.text_formatter())
    root.handlers[:], root.level = handlers, level


def test_log_format_chooses_the_form_and_a_bad_value_stops_with_one_line(bundle_log, monkeypatch):
    logging.getLogger("bundle.test").info("as text")
    monkeypatch.setenv("LOG_FORMAT", "JSON")
    logsetup.configure_logging("audio")
    logging.getLogger("bundle.test").info("as json")
    text_line, json_line = bundle_log.getvalue().splitlines()
    assert text_line.endswith(" INFO bundle.test as text")
    assert json.loads(json_line)["message"] == "as json" and json.loads(json_line)["service"] == "audio"
    assert len([h for h in logging.getLogger().handlers if getattr(h, "_bundle", False)]) == 1
    monkeypatch.setenv("LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match=r"^LOG_FORMAT must be one of text, json, got 'xml'$"):
        logsetup.configure_logging()


def test_a_greenlet_s_uncaught_error_is_a_record_not_the_hub_s_print(bundle_log, monkeypatch):
    import gevent

    def fails(secret):
        raise ValueError("broken\nFAKE line")

    monkeypatch.setenv("LOG_FORMAT", "json")
    logsetup.configure_logging("notebook")
    gevent.spawn(fails, SECRET).join()
    gevent.spawn(lambda: gevent.getcurrent().kill()).join()  # GreenletExit: not an error, no record
    (entry,) = [json.loads(line) for line in bundle_log.getvalue().splitlines()]
    assert (entry["logger"], entry["level"], entry["service"]) == ("bundle.gevent", "ERROR", "notebook")
    assert entry["message"].startswith("Greenlet test_a_greenlet_s_")
    assert entry["message"].endswith(".<locals>.fails failed with ValueError")
    assert entry["exception"].endswith("ValueError: broken\nFAKE line") and SECRET not in json.dumps(entry)


def test_a_warning_is_a_record(bundle_log, monkeypatch):
    import warnings

    monkeypatch.setenv("LOG_FORMAT", "json")
    with warnings.catch_warnings():  # pytest's own showwarning, which records warnings, comes back after
        warnings.simplefilter("always")
        logging.captureWarnings(False)  # forget an earlier capture: configure_logging's is the one tested
        logsetup.configure_logging("audio")
        warnings.warn("mind the gap\nFAKE line", UserWarning, stacklevel=1)
    (entry,) = [json.loads(line) for line in bundle_log.getvalue().splitlines()]
    assert (entry["logger"], entry["level"], entry["service"]) == ("py.warnings", "WARNING", "audio")
    assert "UserWarning: mind the gap\nFAKE line" in entry["message"]


def test_a_command_with_a_bad_log_format_exits_2_with_one_line(monkeypatch):
    commands = CommandLine("python -m app.test", "A test.")
    commands.add("go", "do it", lambda args, streams: 0)
    monkeypatch.setenv("LOG_FORMAT", "syslog")
    err = io.StringIO()
    assert commands.main(["go"], err=err) == 2
    assert err.getvalue() == "error: LOG_FORMAT must be one of text, json, got 'syslog'\n"


def test_the_service_of_a_process_is_its_service_variable(monkeypatch):
    monkeypatch.setenv("SERVICE", "notebook")
    assert logsetup.service_of_process() == "notebook"


# --------------------------------------------------------------------------- the request line


@pytest.mark.parametrize(
    "path, rule, arguments, shown",
    [
        ("/notes/42", "/notes/<int:note_id>", {"note_id": 42}, "/notes/42"),
        ("/s/abc/x", "/s/<token>/x", {"token": "abc"}, "/s/<token>/x"),
        ("/i/7/abc", "/i/<int:team>/<invite_token>", {"team": 7, "invite_token": "abc"}, "/i/7/<invite_token>"),
        ("/f/a/b", "/f/<path:signature>", {"signature": "a/b"}, "/f/<signature>"),
        ("/k/abc", "/k/<api_key>", {"api_key": "abc"}, "/k/<api_key>"),
        ("/x%0a", None, None, "/x%0a"),  # no rule matched: the path, escaped by the formatter
        ("/monkey/1", "/monkey/<keyboard>", {"keyboard": "1"}, "/monkey/1"),  # a word, not a part of one
        ("/credentials/7", "/credentials/<credential_id>", {"credential_id": "7"}, "/credentials/7"),
        ("/t/7", "/t/<token_id>", {"token_id": "7"}, "/t/7"),  # an id names a record, not a secret
    ],
)
def test_the_text_line_shows_a_secret_variable_by_its_name(path, rule, arguments, shown):
    assert requestlog.shown_path(path, rule, arguments) == shown


@pytest.fixture
def app(bundle_log):
    app = Flask(__name__)
    app.config["SERVICE"] = "decks"
    requestlog.register(app)

    @app.get("/notes/<int:note_id>")
    def note(note_id):
        logging.getLogger("bundle.test").warning("reading note %s", note_id)
        return {"id": note_id}

    @app.get("/share/<token>")
    def shared(token):
        return {"ok": True}

    @app.get("/folder/<token>/")
    def folder(token):
        return {"ok": True}

    return app


def request_lines(stream):
    return [line for line in stream.getvalue().splitlines() if "bundle.request" in line]


CARRIED = {"Authorization": f"Bearer {SECRET}", "Cookie": f"session={SECRET}", "X-Request-Id": "req-1"}


@pytest.mark.parametrize("form", ["text", "json"])
def test_no_secret_reaches_a_request_line(bundle_log, app, monkeypatch, form):
    monkeypatch.setenv("LOG_FORMAT", form)
    logsetup.configure_logging("decks")  # as a start with this LOG_FORMAT
    client = app.test_client()
    assert client.get(f"/share/{SECRET}?token={SECRET}", headers=CARRIED).status_code == 200
    assert client.get(f"/notes/42?password={SECRET}", headers=CARRIED).status_code == 200
    assert client.get(f"/nothing/{SECRET[:6]}?code={SECRET}").status_code == 404
    assert client.post(f"/share/{SECRET}").status_code == 405  # no rule matched, one would by GET
    assert client.get(f"/folder/{SECRET}").status_code == 308  # one would once redirected
    text = bundle_log.getvalue()
    assert SECRET not in text
    share, note, nothing, refused, redirected = request_lines(bundle_log)
    if form == "text":
        assert " GET /share/<token> 200 " in share and share.endswith(" id=req-1")
        assert " GET /notes/42 200 " in note and " GET /nothing/Sekret 404 " in nothing
        assert " POST /share/<token> 405 " in refused and " GET /folder/<token>/ 308 " in redirected
        return
    share, note, nothing, refused, redirected = (
        json.loads(line) for line in (share, note, nothing, refused, redirected)
    )
    assert (share["route"], share["status"], share["request_id"]) == ("/share/<token>", 200, "req-1")
    assert (note["method"], note["route"]) == ("GET", "/notes/<int:note_id>")
    assert note["message"].startswith("GET /notes/<int:note_id> 200 ")
    assert nothing["route"] is None and "nothing" not in json.dumps(nothing)
    assert (refused["route"], refused["status"], redirected["route"], redirected["status"]) == (None, 405, None, 308)
    (inside,) = [json.loads(line) for line in text.splitlines() if "reading note" in line]
    assert inside["request_id"] == "req-1" and inside["level"] == "WARNING"


@pytest.mark.parametrize("form", ["text", "json"])
def test_a_line_written_before_routing_finds_its_rule(bundle_log, app, monkeypatch, form):
    """The workspace's apps front answers before Flask routes: log_line looks the rule up."""
    monkeypatch.setenv("LOG_FORMAT", form)
    logsetup.configure_logging("decks")
    with app.app_context():
        requestlog.log_line("GET", f"/share/{SECRET}", 200, time.monotonic(), "front-1")
        requestlog.log_line("GET", "/notes/7", 200, time.monotonic(), "front-2")
        requestlog.log_line("POST", f"/share/{SECRET}", 405, time.monotonic(), "front-3")  # a rule by GET
        requestlog.log_line("GET", f"/folder/{SECRET}", 308, time.monotonic(), "front-4")  # once redirected
    share, note, refused, redirected = request_lines(bundle_log)
    assert SECRET not in bundle_log.getvalue()
    if form == "text":
        assert " GET /share/<token> 200 " in share and " GET /notes/7 200 " in note
        assert " POST /share/<token> 405 " in refused and " GET /folder/<token>/ 308 " in redirected
    else:
        routes = [json.loads(line)["route"] for line in (share, note, refused, redirected)]
        assert routes == ["/share/<token>", "/notes/<int:note_id>", None, None]  # the route only when matched


class EndedSubscription:
    """A subscription that ends at once, as a broker's does when the service stops."""

    def get(self):
        raise SubscriptionClosed("stopping")

    def interrupt(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("form", ["text", "json"])
def test_a_stream_s_end_line_masks_a_secret_and_names_its_route(bundle_log, app, monkeypatch, form):
    """The stream logs its end after the request's context is gone: the line shows the
    path as the request line does (a secret variable by its name) and, in JSON, the route
    and the request's id."""
    monkeypatch.setenv("LOG_FORMAT", form)
    logsetup.configure_logging("decks")

    @app.get("/share/<token>/events")
    def events(token):
        return sse.stream_response([{"n": 1}], EndedSubscription())

    answer = app.test_client().get(f"/share/{SECRET}/events?token={SECRET}", headers=CARRIED)
    assert b"closed: stopping" in answer.get_data()
    answer.close()
    (ended,) = [line for line in bundle_log.getvalue().splitlines() if "bundle.sse" in line]
    assert SECRET not in bundle_log.getvalue()
    if form == "text":
        assert " bundle.sse stream /share/<token>/events ended after " in ended and ended.endswith(": stopping")
        return
    entry = json.loads(ended)
    assert (entry["route"], entry["request_id"], entry["ending"]) == ("/share/<token>/events", "req-1", "stopping")
    assert entry["message"].startswith("stream /share/<token>/events ended after ")
    assert isinstance(entry["duration_ms"], float)
