"""The log of every service under gunicorn, in both forms (LOG_FORMAT=text and json):
requests that carry a secret in the query string, an Authorization header, a cookie, a
password or token header, and the workspace's passwords and session tokens, leave no
trace of it; each JSON line parses, has the fields an admin queries, and the request
line names the route's template, never the path. (No route of the five services has a
secret in its path: a variable named for one is masked in the text line, tested in
tests/unit/common/test_logsetup.py.) What would bypass logging, a greenlet's uncaught
error and a warning, comes through it too."""

import json
import uuid

import pytest
import requests

from devtools import services
from devtools.waiting import wait_for
from tests.support.wizard import TEST_IDENTITY
from tests.support.workspace import AGENT_ENV, TOKEN_HEADER, Workspace, create_workspace, wait_status

# What every service's JSON line holds, and a request line besides.
FIELDS = {"time", "level", "service", "logger", "message", "pid"}
REQUEST_FIELDS = {"request_id", "method", "route", "status", "duration_ms"}
# CR, LF, NEL, LINE SEPARATOR, RIGHT-TO-LEFT OVERRIDE in a path (as in test_hostile_input).
FORGING_PATH = "/x%0aFAKE-LF%0dFAKE-CR%c2%85FAKE-NEL%e2%80%a8FAKE-LS%e2%80%aeFAKE-RLO"


def carried(secret):
    """Headers that carry `secret` as a client's credentials would."""
    return {
        "Authorization": f"Bearer {secret}",
        "Cookie": f"session={secret}; workspace_session_token={secret}",
        "X-Api-Key": secret,
    }


def query(secret):
    return f"?token={secret}&password={secret}&access_token={secret}&code={secret}"


def workspace_requests(service, secret, request_id):
    """A first user whose password is the secret, a login with it, a wrong one, the
    minted session token in its header and cookie, an OIDC callback and an app ticket."""
    ws = Workspace(service)
    token = ws.first_user(password=secret)
    assert ws.login("owner@example.com", secret).status_code == 201
    assert ws.login("owner@example.com", secret + "-wrong").status_code == 401
    me = requests.get(ws.api + "/users/me" + query(secret), headers={TOKEN_HEADER: token}, timeout=30)
    assert me.status_code == 200, me.text
    requests.get(ws.url + "/", cookies={"workspace_session_token": token}, timeout=30)
    requests.get(ws.api + f"/users/oidc/callback?code={secret}&state={secret}", timeout=30)
    requests.get(
        ws.url + f"/@owner/ws/apps/code/some/path?workspace_app_ticket={secret}",
        headers={TOKEN_HEADER: token},
        timeout=30,
    )
    requests.get(ws.api + "/workspaces/" + str(uuid.uuid4()) + query(secret), headers=carried(secret), timeout=30)
    last = requests.get(ws.api + "/users/me", headers={TOKEN_HEADER: token, "X-Request-Id": request_id}, timeout=30)
    return [token], ("/api/v2/users/me", last.status_code)


def decks_requests(service, secret, request_id):
    requests.get(service.base_url + "/api/sessions/" + uuid.uuid4().hex + query(secret), timeout=30)
    last = requests.get(
        service.base_url + "/api/sessions" + query(secret),
        headers={**carried(secret), "X-Request-Id": request_id},
        timeout=30,
    )
    return [], ("/api/sessions", last.status_code)


def notebook_requests(service, secret, request_id):
    """The notebook's password is the secret: sent as a Bearer, as X-Password, and wrong."""
    url = service.base_url
    assert requests.get(url + "/api/notebooks", headers={"X-Password": secret}, timeout=30).status_code == 200
    assert requests.get(url + "/api/notebooks", headers=carried(secret + "-wrong"), timeout=30).status_code == 401
    requests.get(url + "/api/notes/" + uuid.uuid4().hex + query(secret), headers=carried(secret), timeout=30)
    last = requests.get(
        url + "/api/notebooks" + query(secret), headers={**carried(secret), "X-Request-Id": request_id}, timeout=30
    )
    assert last.status_code == 200, last.text
    return [], ("/api/notebooks", 200)


def audio_requests(service, secret, request_id):
    requests.get(service.base_url + "/api/audio/soundlib/preview/123" + query(secret), timeout=30)
    last = requests.get(
        service.base_url + "/api/audio/voices" + query(secret),
        headers={**carried(secret), "X-App-Request": "1", "X-Request-Id": request_id},
        timeout=30,
    )
    assert last.status_code == 200, last.text
    return [], ("/api/audio/voices", 200)


def wizard_requests(service, secret, request_id):
    user = {"X-Wiz-Test-User": "alice"}
    requests.get(service.base_url + "/uploads/" + uuid.uuid4().hex + ".webp" + query(secret), timeout=30)
    last = requests.get(
        service.base_url + "/api/collections/wizards" + query(secret),
        headers={**carried(secret), **user, "X-Request-Id": request_id},
        timeout=30,
    )
    assert last.status_code == 200, last.text
    return [], ("/api/collections/<name>", 200)


# Each service: its environment (given the secret) and the requests that carry it.
SERVICES = {
    "workspace": (lambda secret: {}, workspace_requests),
    "decks": (lambda secret: {}, decks_requests),
    "notebook": (lambda secret: {"NOTEBOOK_PASSWORD": secret}, notebook_requests),
    "audio": (lambda secret: {"AUDIO_PUBLIC_ORIGIN": "https://audio.test.example"}, audio_requests),
    "wizard": (lambda secret: dict(TEST_IDENTITY), wizard_requests),
}


def run(start_service, tmp_path, name, log_format):
    """Starts `name` with LOG_FORMAT=`log_format`, sends its requests and a path that
    tries to forge a line, stops it; (its log, the secrets, the last request's id,
    (route, status) of that request)."""
    secret = f"Sekret-{uuid.uuid4().hex}"
    env, requests_of = SERVICES[name]
    log_path = tmp_path / "stderr"
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
        service = start_service(name, env={**env(secret), "LOG_FORMAT": log_format}, stderr=log_file)
    request_id = f"last-{name}"
    requests.get(service.base_url + FORGING_PATH + query(secret), timeout=30)
    minted, expected = requests_of(service, secret, request_id)
    service.stop()  # every line written, gunicorn's last ones too
    return log_path.read_text(), [secret, *minted], request_id, expected


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_json_log_has_one_object_a_line_and_no_secret(start_service, tmp_path, name):
    text, secrets, request_id, (route, status) = run(start_service, tmp_path, name, "json")
    for secret in secrets:
        assert secret not in text
    entries = [json.loads(line) for line in text.splitlines()]  # every line is one object
    assert all(FIELDS <= entry.keys() for entry in entries), text
    assert {entry["service"] for entry in entries} == {name}
    assert {"gunicorn.error", "bundle.request"} <= {entry["logger"] for entry in entries}
    assert all(line.isascii() and line.isprintable() for line in text.splitlines())
    lines = [entry for entry in entries if entry["logger"] == "bundle.request"]
    assert all(REQUEST_FIELDS <= entry.keys() for entry in lines), lines
    assert all(entry["route"] is None or "?" not in entry["route"] for entry in lines)
    assert not [entry for entry in lines if "FAKE" in json.dumps(entry)], "the path is not the route"
    (last,) = [entry for entry in lines if entry["request_id"] == request_id]
    assert (last["method"], last["route"], last["status"]) == ("GET", route, status)
    assert isinstance(last["duration_ms"], float) and last["duration_ms"] >= 0
    assert last["time"].endswith("Z") and last["level"] == "INFO" and isinstance(last["pid"], int)


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_text_log_has_its_lines_and_no_secret(start_service, tmp_path, name):
    text, secrets, request_id, (route, status) = run(start_service, tmp_path, name, "text")
    for secret in secrets:
        assert secret not in text
    assert not [line for line in text.splitlines() if line.startswith("FAKE")], text
    (last,) = [line for line in text.splitlines() if f"id={request_id}" in line]
    assert " INFO bundle.request GET " in last and f" {status} " in last


def test_a_proxied_app_request_logs_its_route_in_json(start_service, start_agent, local_app, tmp_path):
    """The workspace's apps front answers before Flask routes the request: its line too
    names the route, and neither the query, the credentials nor the tokens."""
    secret = f"Sekret-{uuid.uuid4().hex}"
    log_path = tmp_path / "stderr"
    with open(log_path, "wb") as log_file:
        service = start_service("workspace", env={**AGENT_ENV, "LOG_FORMAT": "json"}, stderr=log_file)
    ws = Workspace(service)
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main", "apps": [{"slug": "echo", "url": local_app.url}]}])
    agent = agent["agents"][0]
    start_agent(ws.url, agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
    answer = requests.get(
        ws.url + "/@owner/dev.main/apps/echo/hello" + query(secret),
        headers={**carried(secret), TOKEN_HEADER: owner, "X-Request-Id": "front-1"},
        timeout=10,
    )
    assert answer.status_code == 200 and answer.headers["X-Request-Id"] == "front-1"
    service.stop()
    text = log_path.read_text()
    assert secret not in text and owner not in text and agent["token"] not in text
    entries = [json.loads(line) for line in text.splitlines()]
    (line,) = [entry for entry in entries if entry.get("request_id") == "front-1"]
    assert (line["route"], line["status"]) == ("/@<user>/<target>/apps/<slug>/<path:path>", 200)


# The deck service's real entry point (wsgi.py, in its worker), then a greenlet that
# raises in that worker and a warning: what a bug in any service's code would do.
FAILING_WSGI = """
import runpy
import warnings

import gevent

app = runpy.run_path({wsgi!r})["app"]


def holds_a_credential(secret):
    raise RuntimeError("a greenlet failed on purpose\\nFAKE-LINE")


gevent.spawn_later(0.2, holds_a_credential, {secret!r})
warnings.warn("a warning on purpose\\nFAKE-LINE", UserWarning, stacklevel=1)
"""


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_greenlet_s_error_and_a_warning_in_a_worker_are_records_of_the_log(start_service, tmp_path, log_format):
    """gevent's hub prints a greenlet's uncaught error, and `warnings` its warnings,
    straight to stderr; in a real gunicorn worker both come through logging instead:
    one JSON object each (the traceback in it), or the text form's lines (a traceback
    after its record's line). The greenlet's arguments (gevent's own line shows their
    reprs) are not written."""
    secret = f"Sekret-{uuid.uuid4().hex}"
    root = tmp_path / "root"  # the checkout's gunicorn.conf.py, and a wsgi.py that runs the real one
    root.mkdir()
    (root / "gunicorn.conf.py").symlink_to(services.ROOT / "gunicorn.conf.py")
    (root / "wsgi.py").write_text(FAILING_WSGI.format(wsgi=str(services.ROOT / "wsgi.py"), secret=secret))
    log_path = tmp_path / "stderr"
    env = {"LOG_FORMAT": log_format, "PYTHONPATH": str(services.ROOT)}
    with open(log_path, "wb") as log_file:
        service = start_service("decks", env=env, stderr=log_file, root=root)
    wait_for(lambda: "holds_a_credential failed" in log_path.read_text(), "the greenlet's error", timeout=20)
    assert requests.get(service.base_url + "/healthz", timeout=10).status_code == 200  # the worker lives on
    service.stop()
    text = log_path.read_text()
    assert secret not in text
    if log_format == "text":  # a traceback keeps its lines there (app.common.logsetup), a warning is one
        assert " ERROR bundle.gevent Greenlet holds_a_credential failed with RuntimeError\nTraceback" in text
        assert " WARNING py.warnings " in text and "UserWarning: a warning on purpose\\nFAKE-LINE" in text
        return
    entries = [json.loads(line) for line in text.splitlines()]  # every line is one object
    assert all(FIELDS <= entry.keys() and entry["service"] == "decks" for entry in entries), text
    (failed,) = [entry for entry in entries if entry["logger"] == "bundle.gevent"]
    assert failed["level"] == "ERROR" and failed["message"] == "Greenlet holds_a_credential failed with RuntimeError"
    assert failed["exception"].endswith("RuntimeError: a greenlet failed on purpose\nFAKE-LINE")
    assert failed["pid"] in {entry["pid"] for entry in entries if entry["logger"] == "py.warnings"}
    (warned,) = [entry for entry in entries if entry["logger"] == "py.warnings"]
    assert warned["level"] == "WARNING" and "UserWarning: a warning on purpose\nFAKE-LINE" in warned["message"]
