"""The workspace apps proxy:

    /@<user>/<workspace>.<agent>/apps/<slug>/<path>    (also /%40<user>/..., and
    /@<user>/<workspace>/apps/<slug>/<path> when the workspace has one agent)

Any method, through the agent's connection (one mux stream per request) to the app's
local URL inside the workspace. The app sees `/<path>?<query>` (the prefix is
stripped, and given in X-Forwarded-Prefix), Host set to its own address, and
X-Forwarded-For/-Proto/-Host. The platform's credentials never reach it: the
`Workspace-Session-Token` header, the `workspace_session_token` cookie and query
parameter are removed.

Bodies stream both ways: the request body is read from the WSGI input while the
answer is already coming back, and the answer is a generator (a greenlet per
request under gevent, no thread). A websocket upgrade (any `Upgrade:` request) is
spliced: the handshake goes to the app as it is and from then on raw bytes flow
between the client's socket and the stream.

Access: a signed-in user (session cookie, header or query token). Sharing level
`owner`: the workspace's owner and site administrators; `authenticated`: anyone
signed in. Others get 404, as if the app did not exist. Unauthenticated browsers
(Accept has text/html) are sent to /login with a redirect back; machine clients get
401 JSON. An agent that is not connected gives a 502 page (JSON for machines).
"""
import logging
from urllib.parse import urlencode, urlsplit

import gevent
from flask import Response, redirect, render_template, request
from peewee import JOIN

from app.common.clientaddr import client_address
from app.common.db import BuiltOnce
from app.common.failures import Failure, Invalid, NotFound, UpstreamFailed, UpstreamTimeout
from app.workspace import agents, bp, sessions, websocket
from app.workspace.models import User, Workspace, WorkspaceAgent, WorkspaceApp, database
from app.workspace.mux import MAX_DATA, StreamClosed, splice
from app.workspace.workspaces import may_manage

log = logging.getLogger("bundle.workspace.apps")

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND", "PROPPATCH", "MKCOL", "COPY",
           "MOVE", "LOCK", "UNLOCK", "REPORT", "SEARCH"]
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "trailers", "transfer-encoding", "upgrade"}
# Replaced or removed on the way to the app (besides the hop-by-hop headers).
NOT_FORWARDED = HOP_BY_HOP | {"host", "expect", "content-length", "workspace-session-token", "x-forwarded-for",
                              "x-forwarded-proto", "x-forwarded-host", "x-forwarded-prefix"}
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- who and what

def wants_html():
    return "text/html" in request.headers.get("Accept", "")


def original_path():
    return request.full_path.rstrip("?")


def page_error(exc):
    """A Failure as a browser or a machine client expects it: a sign-in redirect
    or an HTML page for browsers, the platform's JSON error for machines."""
    if not wants_html():
        raise exc
    if exc.status == 401:
        return redirect("/login?" + urlencode({"redirect": original_path()}), 303)
    return render_template("workspace/app_error.html", error=exc), exc.status


def find_agent(username, target):
    """(agent, workspace, owner) named by `<workspace>.<agent>` (or `<workspace>`
    when it has one agent), else 404."""
    workspace_name, _, agent_name = target.partition(".")
    found = list(WorkspaceAgent.select(WorkspaceAgent, Workspace, User).join(Workspace).join(User)
                 .where((User.username_key == username.lower()) & (Workspace.name == workspace_name)))
    return _the_agent(found, agent_name, lambda agent: agent.name)


def _the_agent(found, agent_name, name_of):
    """The one of a workspace's agents (`found`) that `agent_name` names, or its only
    agent when no name is given; else 404."""
    if agent_name:
        found = [item for item in found if name_of(item) == agent_name]
    elif len(found) > 1:
        raise NotFound("This workspace has several agents: name one, as <workspace>.<agent>.")
    if len(found) != 1:
        raise NotFound("Workspace agent not found.")
    return found[0]


class AppTarget:
    """What a proxied request needs of its app, from one prebuilt query."""
    __slots__ = ("agent_id", "agent_name", "workspace_name", "owner_id", "owner_name", "slug", "url", "sharing_level")

    def __init__(self, *values):
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)

    @property
    def prefix(self):
        return f"/@{self.owner_name}/{self.workspace_name}.{self.agent_name}/apps/{self.slug}"


_TARGET_FIELDS = (WorkspaceAgent.id, WorkspaceAgent.name, Workspace.name, Workspace.owner, User.username,
                  WorkspaceApp.slug, WorkspaceApp.url, WorkspaceApp.sharing_level)


def _target_query():
    query = (WorkspaceAgent.select(*_TARGET_FIELDS)
             .join(Workspace).join(User)
             .join_from(WorkspaceAgent, WorkspaceApp, JOIN.LEFT_OUTER,
                        on=(WorkspaceApp.agent == WorkspaceAgent.id) & (WorkspaceApp.slug == "?slug?"))
             .where((User.username_key == "?user?") & (Workspace.name == "?workspace?")))
    assert query.sql()[1] == ["?slug?", "?user?", "?workspace?"]  # the order run() passes them in
    return query


# It runs on every proxied request.
_targets = BuiltOnce(_target_query)


def _target_rows(username, workspace_name, slug):
    """One row per agent of the workspace, with the app `slug` where that agent has it."""
    rows = _targets.run(database, [slug, username.lower(), workspace_name]).fetchall()
    return [AppTarget(*(field.python_value(value) if value is not None else None
                        for field, value in zip(_TARGET_FIELDS, row))) for row in rows]


def find_app(viewer, username, target, slug):
    """The AppTarget of `<workspace>.<agent>` (or `<workspace>` when it has one
    agent) and `slug` if `viewer` may use it, else 404."""
    workspace_name, _, agent_name = target.partition(".")
    app = _the_agent(_target_rows(username, workspace_name, slug), agent_name, lambda row: row.agent_name)
    allowed = app.slug is not None and (app.sharing_level == "authenticated" or may_manage(viewer, app.owner_id))
    if not allowed:
        raise NotFound("Workspace app not found.")
    return app


# --------------------------------------------------------------------------- routes

@websocket.route(bp, "/@<user>/<target>/apps/<slug>", methods=METHODS, provide_automatic_options=False)
def app_without_slash(user, target, slug):
    try:
        sessions.current_user()
    except Failure as exc:
        return page_error(exc)
    query = request.query_string.decode("latin-1")
    return redirect(request.path + "/" + (f"?{query}" if query else ""), 307)


@websocket.route(bp, "/@<user>/<target>/apps/<slug>/", defaults={"path": ""}, methods=METHODS,
                 provide_automatic_options=False)
@websocket.route(bp, "/@<user>/<target>/apps/<slug>/<path:path>", methods=METHODS, provide_automatic_options=False)
def app_proxy(user, target, slug, path):
    try:
        viewer = sessions.current_user()
        app = find_app(viewer, user, target, slug)
        database.close()  # a proxied answer may last long: give the pooled connection back now
        upgrade = "HTTP_UPGRADE" in request.environ
        if upgrade and request.environ.get("gunicorn.socket") is None:
            raise Invalid("Upgrades need the platform's server (gunicorn).")
        stream = agents.open_stream(app.agent_id, {"kind": "app", "url": app.url}, request_head(app.url, app.prefix))
    except Failure as exc:
        return page_error(exc)
    return _splice_upgrade(stream) if upgrade else _forward(stream)


# --------------------------------------------------------------------------- the request to the app

def forwarded_target():
    """`/<path>?<query>` as the client sent it (still percent-encoded), less the
    prefix and the platform's token parameter."""
    raw = request.environ.get("RAW_URI") or request.full_path
    raw_path, _, raw_query = raw.partition("?")
    parts = raw_path.split("/", 5)  # '', '@user', 'workspace.agent', 'apps', 'slug', rest
    kept = [item for item in raw_query.split("&")
            if item and item.split("=", 1)[0] != sessions.COOKIE]
    return "/" + (parts[5] if len(parts) > 5 else "") + ("?" + "&".join(kept) if kept else "")


def _without_platform_cookie(value):
    pairs = [pair for pair in value.split(";") if pair.split("=", 1)[0].strip() != sessions.COOKIE]
    return ";".join(pairs).strip()


def _client_headers():
    environ = request.environ
    named_in_connection = {name.strip().lower() for name in environ.get("HTTP_CONNECTION", "").split(",")}
    for key, value in environ.items():
        if not key.startswith("HTTP_"):
            continue
        name = key[5:].replace("_", "-").title()
        lower = name.lower()
        if lower in NOT_FORWARDED or lower in named_in_connection:
            continue
        if lower == "cookie":
            value = _without_platform_cookie(value)
            if not value:
                continue
        yield name, value
    if environ.get("CONTENT_TYPE"):
        yield "Content-Type", environ["CONTENT_TYPE"]


def _body_framing():
    """(header lines, chunked?) of the request body."""
    if request.environ.get("CONTENT_LENGTH"):
        return [f"Content-Length: {int(request.environ['CONTENT_LENGTH'])}"], False
    if "chunked" in request.environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return ["Transfer-Encoding: chunked"], True
    return [], False


def request_head(app_url, prefix):
    upgrade = request.environ.get("HTTP_UPGRADE")
    lines = [f"{request.method} {forwarded_target()} HTTP/1.1", f"Host: {urlsplit(app_url).netloc}"]
    lines += [f"{name}: {value}" for name, value in _client_headers()]
    lines += [f"X-Forwarded-For: {client_address()}", f"X-Forwarded-Proto: {request.scheme}",
              f"X-Forwarded-Host: {request.host}", f"X-Forwarded-Prefix: {prefix}"]
    if upgrade:
        lines += ["Connection: Upgrade", f"Upgrade: {upgrade}"]
    else:
        # One request per stream (the agent dials the app for each one).
        lines += ["Connection: close"] + _body_framing()[0]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _send_body(stream, environ, chunked):
    body = environ["wsgi.input"]
    try:
        while True:
            data = body.read(MAX_DATA)
            if not data:
                break
            stream.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        if chunked:
            stream.write(b"0\r\n\r\n")
    except StreamClosed:
        pass
    except OSError:
        stream.close("the client's request body was cut")


def _splice_upgrade(stream):
    """The request head went with the OPEN; from now on raw bytes both ways."""
    sock = request.environ["gunicorn.socket"]
    sock.settimeout(None)
    try:
        splice(stream, sock)
    except StreamClosed:
        pass
    finally:
        stream.close()
    return websocket.taken_over()


def _forward(stream):
    """The request head went with the OPEN: the body (if any) follows while the
    answer is read."""
    framing, chunked = _body_framing()
    sender = gevent.spawn(_send_body, stream, request.environ, chunked) if framing else None
    reader = StreamReader(stream)
    try:
        status, headers = reader.response_head()
    except (StreamClosed, ValueError) as exc:
        _end(stream, sender)
        return page_error(UpstreamFailed("The workspace app is not reachable.", detail=str(exc)))
    except TimeoutError:
        _end(stream, sender)
        return page_error(UpstreamTimeout("The workspace app did not answer in time."))
    return _response(stream, sender, reader, status, headers)


def _end(stream, sender):
    stream.close()
    if sender is not None:
        sender.kill()


# --------------------------------------------------------------------------- the app's answer

class StreamReader:
    """Buffered reads of an HTTP/1.1 answer from a stream."""

    def __init__(self, stream):
        self.stream = stream
        self.buffer = b""

    def _more(self, timeout=None):
        data = self.stream.read(timeout)
        if data is None:
            raise TimeoutError()
        self.buffer += data
        return bool(data)

    def response_head(self):
        """(status line's "code reason", [(name, value)]); 1xx interim answers skipped."""
        while True:
            while b"\r\n\r\n" not in self.buffer:
                if len(self.buffer) > HEAD_LIMIT:
                    raise ValueError("the app's response head is too large")
                if not self._more(HEAD_TIMEOUT_S):
                    raise ValueError("the app closed the connection without answering")
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            version, _, status = lines[0].partition(" ")
            if not version.startswith("HTTP/1.") or not (status[:3].isdigit() and status[3:4] in ("", " ")):
                raise ValueError(f"the app did not answer HTTP: {lines[0][:80]!r}")
            if not status.startswith("1"):
                # A header may not be split by a bare CR or LF (werkzeug would refuse it: a 500).
                if any("\r" in line or "\n" in line for line in lines):
                    raise ValueError("a header of the app's answer has a bare CR or LF")
                return status, [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]

    def take(self, limit):
        """Up to `limit` bytes (b"" at the end); a chunk as the stream gave it when it
        fits (no copy)."""
        if not self.buffer:
            data = self.stream.read()
            if data is None:
                raise TimeoutError()
            if len(data) <= limit:
                return data
            self.buffer = data
        data, self.buffer = self.buffer[:limit], self.buffer[limit:]
        return data

    def line(self):
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > HEAD_LIMIT or not self._more():
                raise ValueError("a broken chunked body")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def exactly(self, count):
        while len(self.buffer) < count:
            if not self._more():
                raise ValueError("the app's body ended early")
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data


def _body(reader, length, chunked):
    if chunked:
        while True:
            size = int(reader.line().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                return
            while size:
                data = reader.take(min(size, MAX_DATA))
                if not data:
                    raise ValueError("the app's body ended early")
                size -= len(data)
                yield data
            reader.exactly(2)
    remaining = length
    while remaining is None or remaining > 0:
        data = reader.take(MAX_DATA if remaining is None else min(remaining, MAX_DATA))
        if not data:
            if remaining:
                raise ValueError("the app's body ended early")
            return
        if remaining is not None:
            remaining -= len(data)
        yield data


def _response(stream, sender, reader, status, headers):
    names = {name.lower(): value for name, value in headers}
    chunked = "chunked" in names.get("transfer-encoding", "").lower()
    length = None if chunked or "content-length" not in names else int(names["content-length"])
    if request.method == "HEAD" or status[:3] in ("204", "304"):
        length, chunked = 0, False

    what = f"{request.method} {request.path}"  # the generator runs after the request context is gone

    def body():
        try:
            yield from _body(reader, length, chunked)
        except (StreamClosed, ValueError) as exc:
            log.warning("%s: the app's answer was cut: %s", what, exc)
            raise
        finally:
            _end(stream, sender)

    kept = [(name, value) for name, value in headers
            if name.lower() not in HOP_BY_HOP and not (chunked and name.lower() == "content-length")]
    response = Response(body(), status=status, headers=kept, direct_passthrough=True)
    if "content-type" not in names:
        del response.headers["Content-Type"]
    return response

