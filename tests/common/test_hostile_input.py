"""Hostile input every service must survive, against each one under gunicorn with the
gevent worker: JSON nested deep enough to exhaust a recursive parser answers 400 in the
service's own error body (it answered 500), and a path or a client error report with
line breaks cannot forge a line of the service's log."""

import http.client
import json

import pytest
import requests

from app.common.clientjson import MAX_JSON_DEPTH
from tests.support.proxy import ServiceLog
from tests.support.wizard import TEST_IDENTITY

# Each service: its environment, a JSON route anyone (or the test identity) may post to,
# the headers it needs and the field of its error body.
SERVICES = {
    "workspace": ({}, "/api/v2/users/login", {}, "message"),
    "decks": ({}, "/api/sessions", {}, "error"),
    "notebook": ({"NOTEBOOK_ALLOW_NO_PASSWORD": "1"}, "/api/notebooks", {}, "detail"),
    "audio": (
        {"AUDIO_PUBLIC_ORIGIN": "https://audio.test.example"},
        "/api/audio/speech",
        {"X-App-Request": "1"},
        "error",
    ),
    "wizard": (TEST_IDENTITY, "/api/errors", {"X-Wiz-Test-User": "alice"}, "error"),
}
# Past the depth json.loads itself fails at (a RecursionError near 1,000), in 6 KB:
# under every route's size limit (the audio service's 8 KB is the smallest).
RECURSION_DEEP = "[" * 3000 + "]" * 3000
JUST_TOO_DEEP = '{"a":' * MAX_JSON_DEPTH + "[]" + "}" * MAX_JSON_DEPTH
DEEPEST_ALLOWED = '{"a":' * (MAX_JSON_DEPTH - 1) + "1" + "}" * (MAX_JSON_DEPTH - 1)


@pytest.fixture(scope="module")
def running(start_module_service, tmp_path_factory):
    """Every service, its stderr in a file: {name: (RunningService, ServiceLog)}."""
    started = {}
    for name, (env, *_rest) in SERVICES.items():
        log_path = tmp_path_factory.mktemp(f"{name}-log") / "stderr"
        with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
            started[name] = start_module_service(name, env=env, stderr=log_file), ServiceLog(log_path)
    return started


@pytest.mark.parametrize("name", list(SERVICES))
@pytest.mark.parametrize("body", [RECURSION_DEEP, JUST_TOO_DEEP], ids=["3000-deep", "65-deep"])
def test_deeply_nested_json_is_a_400_in_the_service_error_body(running, name, body):
    service, log = running[name]
    _env, path, headers, field = SERVICES[name]
    response = requests.post(
        service.base_url + path, data=body, timeout=30, headers={"Content-Type": "application/json", **headers}
    )
    assert response.status_code == 400, response.text
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in response.json()[field]
    assert "unhandled error" not in log.text()


@pytest.mark.parametrize("name", list(SERVICES))
def test_json_as_deep_as_allowed_is_parsed(running, name):
    """The cap refuses no less than it says: this body gets past the parser to the route's
    own checks (a 400 naming a field, or the wizard's 400 on its missing message)."""
    service, _log = running[name]
    _env, path, headers, field = SERVICES[name]
    response = requests.post(
        service.base_url + path,
        data=DEEPEST_ALLOWED,
        timeout=30,
        headers={"Content-Type": "application/json", **headers},
    )
    assert response.status_code == 400, response.text
    assert "nested" not in response.json()[field]


def test_a_deeply_nested_filter_is_a_400_in_the_wizard(running):
    service, _log = running["wizard"]
    # Brackets sent unencoded: 2,000 deep fits gunicorn's 4 KB request line.
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    try:
        connection.request(
            "GET", "/api/collections/wizards?filter=" + "[" * 2000 + "]" * 2000, headers={"X-Wiz-Test-User": "alice"}
        )
        response = connection.getresponse()
        assert response.status == 400
        assert json.loads(response.read())["error"] == f"filter: nested deeper than {MAX_JSON_DEPTH} levels"
    finally:
        connection.close()


# CR, LF, NEL (C1, U+0085), LINE SEPARATOR (U+2028) and a right-to-left override: each
# ends a line, or disguises one, in some reader of the log (journalctl, less, an editor).
FORGING_PATH = "/x%0aFAKE-LF%0dFAKE-CR%c2%85FAKE-NEL%e2%80%a8FAKE-LS%e2%80%aeFAKE-RLO"


def assert_no_forged_line(log, marker):
    """Some line of the log holds `marker` escaped, and no line starts a forgery."""
    line = log.wait_for(marker)
    text = log.text()
    assert not [forged for forged in text.splitlines() if forged.startswith("FAKE")], text
    for escaped in ("\\nFAKE-LF", "\\rFAKE-CR", "\\x85FAKE-NEL", "\\u2028FAKE-LS", "\\u202eFAKE-RLO"):
        assert escaped in line, line
    return line


@pytest.mark.parametrize("name", list(SERVICES))
def test_a_path_with_line_breaks_logs_one_escaped_line(running, name):
    service, log = running[name]
    response = requests.get(service.base_url + FORGING_PATH + f"-{name}", timeout=30)
    assert response.status_code == 404
    line = assert_no_forged_line(log, f"FAKE-RLO-{name}")
    assert line.split(" bundle.request ", 1)[1].startswith("GET /x\\nFAKE-LF")


def test_a_client_error_report_logs_one_escaped_line_within_its_limits(running):
    service, log = running["wizard"]
    forged = "boom\nFAKE-LF\rFAKE-CR\x85FAKE-NEL\u2028FAKE-LS\u202eFAKE-RLO-report"
    response = requests.post(
        service.base_url + "/api/errors",
        timeout=30,
        headers={"X-Wiz-Test-User": "alice"},
        json={"type": "TypeError\nFAKE", "message": forged, "stack": "at a\nat b" + "s" * 20000},
    )
    assert response.status_code == 204, response.text
    log.wait_for("POST /api/errors 204")  # the request's line comes after the report's
    text = log.text()
    lines = [line for line in text.splitlines() if "client: TypeError" in line]
    assert len(lines) == 1, text
    assert not [line for line in text.splitlines() if line.startswith("FAKE")], text
    for escaped in ("\\nFAKE-LF", "\\rFAKE-CR", "\\x85FAKE-NEL", "\\u2028FAKE-LS", "\\u202eFAKE-RLO-report"):
        assert escaped in lines[0]
    assert "TypeError\\nFAKE" in lines[0] and "at a | at b" in lines[0]
    assert len(lines[0]) < 12_000  # type, message and stack each cut to their limit
