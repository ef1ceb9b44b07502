"""The workspace apps proxy:

    /@<user>/<workspace>.<agent>/apps/<slug>/<path>    (also /%40<user>/..., and
    /@<user>/<workspace>/apps/<slug>/<path> when the workspace has one agent)

Any method, through the agent's connection to the app's local URL inside the
workspace (app_proxy.py: what the app sees, how bodies stream, which streams are
kept for the next request). A websocket upgrade (any `Upgrade:` request) is spliced:
the handshake goes to the app as it is and from then on raw bytes flow between the
client's socket and a stream of its own.

Access: a signed-in user (session cookie, header or query token). Sharing level
`owner`: the workspace's owner and site administrators; `authenticated`: anyone
signed in. Others get 404, as if the app did not exist. Unauthenticated browsers
(Accept has text/html) are sent to /login with a redirect back; machine clients get
401 JSON. An agent that is not connected gives a 502 page (JSON for machines).

The front (install_front): a GET or HEAD without a body is served before Flask
routes it, since a page of an app asks for many small files and Flask's request path
cost more than the rest of the proxy. Every request is checked: a token and an app
that were allowed a moment ago are taken from grants.py, which drops them as soon as
anything that could take access away has changed (a revoked token is refused by the
next request); otherwise checked in the database as the route does. Whatever the
front does not answer itself (a refusal, an upgrade, a body, an app that fails) goes
to the route, which answers it as it answers everything else.
"""
import logging
import re
import time
from urllib.parse import urlencode

from flask import Response, redirect, render_template, request
from peewee import JOIN

from app.common import requestlog
from app.common.db import BuiltOnce
from app.common.failures import Failure, Invalid, NotFound
from app.workspace import agents, app_proxy, bp, grants, sessions, websocket
from app.workspace.models import User, Workspace, WorkspaceAgent, WorkspaceApp, database
from app.workspace.mux import StreamClosed, splice
from app.workspace.workspaces import may_manage

log = logging.getLogger("bundle.workspace.apps")
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND", "PROPPATCH", "MKCOL", "COPY",
           "MOVE", "LOCK", "UNLOCK", "REPORT", "SEARCH"]
# Where the front leaves the app's failure for the route to answer.
FRONT_FAILURE = "bundle.workspace.app_failure"
FRONT_PATH = re.compile(r"/@([^/]+)/([^/]+)/apps/([^/]+)/")
FRONT_METHODS = ("GET", "HEAD")


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
def app_route(user, target, slug, path):
    try:
        viewer = sessions.current_user()
        app = find_app(viewer, user, target, slug)
        database.close()  # a proxied answer may last long: give the pooled connection back now
        failure = request.environ.pop(FRONT_FAILURE, None)
        if failure is not None:
            raise failure
        if "HTTP_UPGRADE" in request.environ:
            return _splice_upgrade(app)
        answer = app_proxy.exchange(request.environ, app)
    except Failure as exc:
        return page_error(exc)
    # An iterator, not a list: werkzeug would add a Content-Length the app did not send.
    try:
        response = Response(iter(answer.body), status=answer.status, headers=answer.headers, direct_passthrough=True)
    except BaseException:
        answer.close()
        raise
    if not any(name.lower() == "content-type" for name, _ in answer.headers):
        del response.headers["Content-Type"]
    return response


def _splice_upgrade(app):
    """The request head goes with the OPEN of a stream of its own; from then on raw
    bytes both ways."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        raise Invalid("Upgrades need the platform's server (gunicorn).")
    stream = agents.open_stream(app.agent_id, {"kind": "app", "url": app.url},
                                app_proxy.request_head(request.environ, app.url, app.prefix))
    sock.settimeout(None)
    try:
        splice(stream, sock)
    except StreamClosed:
        pass
    finally:
        stream.close()
    return websocket.taken_over()


# --------------------------------------------------------------------------- the front

def install_front(flask_app):
    """Serve plain GETs and HEADs of apps before Flask (see the module's text)."""
    routed = flask_app.wsgi_app

    def front(environ, start_response):
        if environ["REQUEST_METHOD"] in FRONT_METHODS and "HTTP_UPGRADE" not in environ:
            path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
            match = FRONT_PATH.match(path)
            if match and not app_proxy.has_body(environ):
                try:
                    with flask_app.app_context():  # sessions read the settings from it
                        answer = _front_answer(environ, path, *match.groups())
                except Exception:  # a database or generation failure: the route answers it as any other
                    log.exception("the apps front failed; the route answers %s", path)
                    answer = None
                if answer is not None:
                    try:
                        start_response(answer.status, answer.headers)
                    except BaseException:
                        answer.close()
                        raise
                    return answer.body
        return routed(environ, start_response)

    flask_app.wsgi_app = front


def _front_answer(environ, path, username, target, slug):
    """The app's Answer with the request's id, logged as the route's would be; None
    for the route to answer (a refusal, an app that fails)."""
    started = time.monotonic()
    token = sessions.token_in(environ)
    try:
        app = grants.kept(("app", token, username.lower(), target, slug),
                          lambda: _checked_app(token, username, target, slug))
    except Failure:
        return None  # the route says why, as this client expects it
    try:
        answer = app_proxy.exchange(environ, app)
    except Failure as exc:
        environ[FRONT_FAILURE] = exc
        return None
    request_id = requestlog.request_id(environ.get("HTTP_X_REQUEST_ID", ""))
    answer.headers.append(("X-Request-Id", request_id))
    requestlog.log_line(environ["REQUEST_METHOD"], path, int(answer.status[:3]), started, request_id)
    return answer


def _checked_app(token, username, target, slug):
    """(the AppTarget the token may use, how long that may be kept: until the session
    would be extended); a Failure if it may not."""
    database.connect(reuse_if_open=True)
    try:
        viewer, key = sessions.authenticate(token)
        return find_app(viewer, username, target, slug), sessions.seconds_before_slide(key)
    finally:
        database.close()
