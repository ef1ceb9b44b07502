"""The workspace apps proxy:

    /@<user>/<workspace>.<agent>/apps/<slug>/<path>    (also /%40<user>/..., and
    /@<user>/<workspace>/apps/<slug>/<path> when the workspace has one agent)

Any method, through the agent's connection to the app's local URL inside the
workspace (app_proxy.py: what the app sees, how bodies stream, which streams are
kept for the next request). A websocket upgrade (any `Upgrade:` request) is spliced:
the handshake goes to the app as it is and from then on raw bytes flow between the
client's socket and a stream of its own.

Two ways to reach an app (app_hosts.py tells the second):
- its path, above, on the platform's own origin: its page's script runs as the
  platform's, with the visitor's cookie. So, as Coder's, locked down by default:
  the workspace's owner only; a site administrator only with
  WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SITE_OWNER_ACCESS; an app shared with signed-in
  users (`authenticated`) only with WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING. Whenever
  someone else's app is opened this way, its answer carries
  `Content-Security-Policy: sandbox ...` without allow-same-origin: its script runs in
  an opaque origin, which the platform's cookie does not reach. The session is the
  platform's (cookie, header or query token). A browser refused a path that its
  app host would serve is redirected there.
- its own host, `<slug>--<agent>--<workspace>--<user>.<wildcard domain>`, when
  WORKSPACE_WILDCARD_ACCESS_URL is set: sharing as the app says (`owner`: the owner
  and site administrators; `authenticated`: anyone signed in), with the app token of
  that host (app_hosts.py's handshake) or the `Workspace-Session-Token` header.
Others get 404, the same whether the user, the workspace, the agent or the app is
missing or not allowed. Unauthenticated browsers (Accept has text/html) are sent to
sign in (/login on the platform, the handshake on an app host); machine clients get
401 JSON. An agent that is not connected gives a 502 page (JSON for machines). On
both kinds, the app's answer never sets a platform cookie and never speaks to nginx
(app_proxy.py strips them).

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

import gevent
from flask import Blueprint, Response, current_app, g, redirect, render_template, request
from peewee import JOIN

from app.common import metrics_http, requestlog
from app.common.db import BuiltOnce
from app.common.failures import Failure, Forbidden, Invalid, NotFound, Unauthenticated, UpstreamFailed
from app.common.headers import APP_PROXY  # on an answer that is the app's own: no headers of ours
from app.workspace.access import app_hosts, grants, sessions
from app.workspace.access.accounts import is_admin
from app.workspace.core.models import User, Workspace, WorkspaceAgent, WorkspaceApp, database
from app.workspace.routes.workspaces import may_manage
from app.workspace.transport import websocket
from app.workspace.transport.mux import StreamClosed, splice
from app.workspace.tunnel import agents, app_proxy

bp = Blueprint("apps", __name__)

log = logging.getLogger("bundle.workspace.apps")
METHODS = [
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "OPTIONS",
    "PROPFIND",
    "PROPPATCH",
    "MKCOL",
    "COPY",
    "MOVE",
    "LOCK",
    "UNLOCK",
    "REPORT",
    "SEARCH",
]
# Where the front leaves the app's failure for the route to answer.
FRONT_FAILURE = "bundle.workspace.app_failure"
FRONT_PATH = re.compile(r"/@([^/]+)/([^/]+)/apps/([^/]+)/")
FRONT_METHODS = ("GET", "HEAD")
# The route templates the request metrics name a front answer by: app_route's rules.
APP_ROOT_RULE = "/@<user>/<target>/apps/<slug>/"
APP_PATH_RULE = "/@<user>/<target>/apps/<slug>/<path:path>"
APP_NOT_FOUND = "Workspace app not found."
AGENT_NOT_FOUND = "Workspace agent not found."
SEVERAL_AGENTS = "This workspace has several agents: name one, as <workspace>.<agent>."
# Someone else's app on the platform's origin: its script gets an opaque origin.
SANDBOX = "sandbox allow-scripts allow-forms allow-popups allow-downloads"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


# --------------------------------------------------------------------------- who and what


def _settings():
    return current_app.config["WORKSPACE"]


def wants_html():
    return "text/html" in request.headers.get("Accept", "")


def original_path():
    return request.full_path.rstrip("?")


def page_error(exc):
    """A Failure as a browser or a machine client expects it: a sign-in redirect
    or an HTML page for browsers, the platform's JSON error for machines."""
    if not wants_html():
        raise exc
    app_host = request.environ.get(app_hosts.ENVIRON_KEY)
    if exc.status == 401 and app_host is not None:
        return redirect(app_hosts.auth_redirect_url(_settings(), app_host, request.environ["RAW_URI"]), 303)
    if exc.status == 401:
        return redirect("/login?" + urlencode({"redirect": original_path()}), 303)
    platform = _settings().access_url if app_hosts.ENVIRON_KEY in request.environ else ""
    return render_template("workspace/app_error.html", error=exc, platform=platform), exc.status


def find_agent(username, target, viewer=None):
    """(agent, workspace, owner) named by `<workspace>.<agent>` (or `<workspace>`
    when it has one agent) if `viewer` (by default the request's) may manage it,
    else 404, the same whatever is missing."""
    viewer = viewer or sessions.current_user()
    workspace_name, _, agent_name = target.partition(".")
    found = [
        agent
        for agent in WorkspaceAgent.select(WorkspaceAgent, Workspace, User)
        .join(Workspace)
        .join(User)
        .where((User.username_key == username.lower()) & (Workspace.name == workspace_name))
        if may_manage(viewer, agent.workspace.owner_id)
    ]
    return _the_one(found, agent_name, lambda agent: agent.name, AGENT_NOT_FOUND)


def _the_one(found, agent_name, name_of, missing):
    """The one of the allowed rows of a workspace's agents (`found`) that `agent_name`
    names, or the only one when no name is given; else 404."""
    if agent_name:
        found = [item for item in found if name_of(item) == agent_name]
    elif len(found) > 1:
        raise NotFound(SEVERAL_AGENTS)
    if len(found) != 1:
        raise NotFound(missing)
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


_TARGET_FIELDS = (
    WorkspaceAgent.id,
    WorkspaceAgent.name,
    Workspace.name,
    Workspace.owner,
    User.username,
    WorkspaceApp.slug,
    WorkspaceApp.url,
    WorkspaceApp.sharing_level,
)


def _target_query():
    query = (
        WorkspaceAgent.select(*_TARGET_FIELDS)
        .join(Workspace)
        .join(User)
        .join_from(
            WorkspaceAgent,
            WorkspaceApp,
            JOIN.LEFT_OUTER,
            on=(WorkspaceApp.agent == WorkspaceAgent.id) & (WorkspaceApp.slug == "?slug?"),
        )
        .where((User.username_key == "?user?") & (Workspace.name == "?workspace?"))
    )
    assert query.sql()[1] == ["?slug?", "?user?", "?workspace?"]  # the order run() passes them in
    return query


# It runs on every proxied request.
_targets = BuiltOnce(_target_query)


def _target_rows(username, workspace_name, slug):
    """One row per agent of the workspace, with the app `slug` where that agent has it."""
    rows = _targets.run(database, [slug, username.lower(), workspace_name]).fetchall()
    return [
        AppTarget(
            *(field.python_value(value) if value is not None else None for field, value in zip(_TARGET_FIELDS, row))
        )
        for row in rows
    ]


def may_open(viewer, app, on_host):
    """Whether `viewer` may open `app` on its own host (`on_host`) or on its path."""
    if str(app.owner_id) == str(viewer.id):
        return True
    settings = _settings()
    if app.sharing_level == "authenticated" and (on_host or settings.path_app_sharing):
        return True
    return is_admin(viewer) and (on_host or settings.path_app_site_owner_access)


def find_app(viewer, username, target, slug, on_host=False):
    """The AppTarget of `<workspace>.<agent>` (or `<workspace>` when it has one
    agent) and `slug` if `viewer` may open it there, else 404."""
    workspace_name, _, agent_name = target.partition(".")
    found = [row for row in _target_rows(username, workspace_name, slug) if may_open(viewer, row, on_host)]
    app = _the_one(found, agent_name, lambda row: row.agent_name, APP_NOT_FOUND)
    if app.slug is None:
        raise NotFound(APP_NOT_FOUND)
    return app


def sandboxed(viewer, app):
    """Whether a path app's answer is sandboxed: someone else's app, or a shared one."""
    return app.sharing_level != "owner" or str(app.owner_id) != str(viewer.id)


def _path_app(viewer, user, target, slug):
    """(AppTarget, sandboxed?) of a path app; a browser refused here that the app's
    host would serve is sent there (_Redirect)."""
    try:
        app = find_app(viewer, user, target, slug)
    except NotFound:
        if _settings().app_hosts_enabled and request.method == "GET" and wants_html():
            on_host = find_app(viewer, user, target, slug, on_host=True)  # a 404 if not there either
            url = app_hosts.app_url(
                _settings(), on_host.slug, on_host.agent_name, on_host.workspace_name, on_host.owner_name
            )
            if url:
                raise _Redirect(url + _rest_of_path()) from None
        raise
    return app, sandboxed(viewer, app)


def _rest_of_path():
    return app_proxy.forwarded_target(request.environ)[1:]


class _Redirect(Exception):
    """A browser is sent to `location` (the app's own host)."""

    def __init__(self, location):
        super().__init__(location)
        self.location = location


# --------------------------------------------------------------------------- app hosts


def host_viewer(environ, app_host):
    """(user, seconds this may be kept) on an app host: the `Workspace-Session-Token`
    header (machine clients), else the host's app token cookie; never the platform's
    cookie nor a query token."""
    token = environ.get("HTTP_WORKSPACE_SESSION_TOKEN")
    if token:
        user, key = sessions.authenticate(token)
        return user, sessions.seconds_before_slide(key)
    cookies = app_hosts.tokens_in(environ, _settings())
    if not cookies:
        raise Unauthenticated("You must be signed in to do this.", detail="no app token was given")
    if (environ["REQUEST_METHOD"] not in SAFE_METHODS or "HTTP_UPGRADE" in environ) and not _from_app_host(
        environ, app_host
    ):
        # Every app host is the same *site*: SameSite=Lax lets another user's app post
        # forms and open websockets to this one with the visitor's cookie.
        raise Forbidden(
            "This request came from another site and was refused.",
            detail="only the app's own pages may send it with the app's cookie",
        )
    key_id, left = app_hosts.read_any_token(cookies, app_host.hostname)
    user, _ = app_hosts.session_of(key_id)
    return user, left


def _from_app_host(environ, app_host):
    """Whether a browser sent this from the app host's own pages (Sec-Fetch-Site, else
    Origin); neither header: not a browser's cross-site request."""
    return sessions.came_from(environ, _settings().app_host_url(app_host.label))


def _host_app(app_host):
    if app_host is None:
        raise NotFound(APP_NOT_FOUND)
    viewer, _ = host_viewer(request.environ, app_host)
    return find_app(viewer, app_host.user, app_host.target, app_host.slug, on_host=True)


def _redeem(app_host, ticket):
    """The handshake's last step on the app host: the ticket for the app token cookie,
    then the same URL without the ticket."""
    if app_host is None:
        raise NotFound(APP_NOT_FOUND)
    viewer, key = app_hosts.session_of(app_hosts.redeem_ticket(ticket, app_host.hostname))
    find_app(viewer, app_host.user, app_host.target, app_host.slug, on_host=True)
    settings = _settings()
    token, max_age = app_hosts.mint_token(app_host.hostname, key)
    clean = app_hosts.without_ticket(request.environ["RAW_URI"])
    # Absolute, on this host: a path such as //elsewhere stays a path.
    response = redirect(settings.app_host_url(app_host.label) + clean, 303)
    response.set_cookie(
        app_hosts.cookie_name(settings),
        token,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="Lax",
        secure=settings.secure_cookies,
    )
    return response


@bp.get(app_hosts.AUTH_REDIRECT)
def app_auth_redirect():
    """The handshake's platform step: a signed-in visitor who may open the app named
    by `redirect_uri` (an app host URL) is sent back there with a ticket."""
    try:
        viewer = sessions.current_user()
        settings = _settings()
        redirect_uri = request.args.get("redirect_uri", "")
        app_host = app_hosts.redirect_target(settings, redirect_uri) if settings.app_hosts_enabled else None
        if app_host is None:
            raise Invalid("redirect_uri: must be the URL of a workspace app's own host", field="redirect_uri")
        find_app(viewer, app_host.user, app_host.target, app_host.slug, on_host=True)
        ticket = app_hosts.mint_ticket(app_host.hostname, g.api_key.id)
    except Failure as exc:
        return page_error(exc)
    return redirect(app_hosts.with_ticket(redirect_uri, ticket), 303)


# --------------------------------------------------------------------------- routes


@websocket.route(bp, "/@<user>/<target>/apps/<slug>", methods=METHODS, provide_automatic_options=False)
def app_without_slash(user, target, slug):
    """Redirect (307) an app's address without its trailing slash to the one with it, once the caller is signed in."""
    try:
        sessions.current_user()
    except Failure as exc:
        return page_error(exc)
    query = request.query_string.decode("latin-1")
    return redirect(request.path + "/" + (f"?{query}" if query else ""), 307)


@websocket.route(bp, APP_ROOT_RULE, defaults={"path": ""}, methods=METHODS, provide_automatic_options=False)
@websocket.route(bp, APP_PATH_RULE, methods=METHODS, provide_automatic_options=False)
def app_route(user, target, slug, path):
    """A workspace app: any method (and websocket upgrades) passed through the agent's connection to the app's local
    URL."""
    try:
        if app_hosts.ENVIRON_KEY in request.environ:
            app_host = request.environ[app_hosts.ENVIRON_KEY]
            ticket = sessions.query_value(request.environ, app_hosts.TICKET_PARAM)
            if ticket and request.method in FRONT_METHODS and "HTTP_UPGRADE" not in request.environ:
                return _redeem(app_host, ticket)
            app, sandbox = _host_app(app_host), False
        else:
            app, sandbox = _path_app(sessions.current_user(), user, target, slug)
        database.close()  # a proxied answer may last long: give the pooled connection back now
        failure = request.environ.pop(FRONT_FAILURE, None)
        if failure is not None:
            raise failure
        if "HTTP_UPGRADE" in request.environ:
            return _splice_upgrade(app)
        answer = app_proxy.exchange(request.environ, app, SANDBOX if sandbox else None)
    except _Redirect as exc:
        return redirect(exc.location, 307)
    except UpstreamFailed as exc:  # the agent not connected, or its connection gone mid-way
        if agents.stopping and request.method in FRONT_METHODS and "HTTP_UPGRADE" not in request.environ:
            return _to_the_next_workers()
        return page_error(exc)
    except Failure as exc:
        return page_error(exc)
    request.environ[APP_PROXY] = True
    # An iterator, not a list: werkzeug would add a Content-Length the app did not send.
    try:
        response = Response(iter(answer.body), status=answer.status, headers=answer.headers, direct_passthrough=True)
    except BaseException:
        answer.close()
        raise
    if not any(name.lower() == "content-type" for name, _ in answer.headers):
        del response.headers["Content-Type"]
    return response


# A stopping worker answers a few more requests (those on its kept-alive connections,
# and those it accepted before it stopped accepting: gunicorn's gevent worker looks
# at its stop flag once a second) after it closed its agents' connections.
NEXT_WORKERS_DELAY_SECONDS = 1.0


def _to_the_next_workers():
    """A GET or HEAD that failed for want of its agent at this stopping worker (a
    restart: it let its agents go, here or at the worker that held the one asked for,
    and they are on their way to the next workers) is sent to itself again, on a new
    connection, which the next workers take: slow, not failed. The answer waits a
    second first, so that the new connection finds this worker no longer accepting."""
    gevent.sleep(NEXT_WORKERS_DELAY_SECONDS)
    target = request.environ.get("RAW_URI") or request.path  # as the client sent it (gunicorn's has the query)
    query = request.environ.get("QUERY_STRING", "")
    answer = redirect(target if "?" in target or not query else f"{target}?{query}", 307)
    answer.headers["Retry-After"] = "1"
    return answer


def _splice_upgrade(app):
    """The request head goes with the OPEN of a stream of its own; the app's answer
    head comes back cleaned (app_proxy.upgrade_answer_head), then raw bytes both ways."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        raise Invalid("Upgrades need the platform's server (gunicorn).")
    stream = agents.open_stream(
        app.agent_id, {"kind": "app", "url": app.url}, app_proxy.request_head(request.environ, app.url, app.prefix)
    )
    try:
        head = app_proxy.upgrade_answer_head(stream)
    except (StreamClosed, ValueError, TimeoutError) as exc:
        # Nothing was sent: the client gets a whole answer of ours, never the splice.
        stream.close()
        raise UpstreamFailed("The workspace app did not accept the upgrade.", detail=str(exc)) from None
    sock.settimeout(None)
    try:
        with websocket.counted("app"):
            sock.sendall(head)
            splice(stream, sock)
    except (StreamClosed, TimeoutError, OSError):
        pass
    finally:
        stream.close()
    return websocket.taken_over()


# --------------------------------------------------------------------------- the front


def install_front(flask_app):
    """Route app host requests to their app; serve plain GETs and HEADs of apps before
    Flask (see the module's text)."""
    routed = flask_app.wsgi_app
    settings = flask_app.config["WORKSPACE"]

    def front(environ, start_response):
        on_app_host, app_host = app_hosts.app_host_of(environ, settings)
        if on_app_host:
            app_hosts.enter(environ, app_host)
        if environ["REQUEST_METHOD"] in FRONT_METHODS and "HTTP_UPGRADE" not in environ:
            path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
            match = FRONT_PATH.match(path)
            if (
                match
                and not app_proxy.has_body(environ)
                and not (on_app_host and sessions.query_value(environ, app_hosts.TICKET_PARAM))
            ):
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
    try:
        app, sandbox = _kept_grant(environ, username, target, slug)
    except Failure:
        return None  # the route says why, as this client expects it
    try:
        answer = app_proxy.exchange(environ, app, SANDBOX if sandbox else None)
    except Failure as exc:
        environ[FRONT_FAILURE] = exc  # the route answers it, as a page of the platform's own
        return None
    environ[APP_PROXY] = True
    try:
        request_id = requestlog.request_id(environ.get("HTTP_X_REQUEST_ID", ""))
        answer.headers.append(("X-Request-Id", request_id))
        status = int(answer.status[:3])
    except BaseException:
        answer.close()  # the front then lets the route answer: this one must not stay open
        raise
    # The app has answered: a failure to log or count it must not send its request again.
    try:
        requestlog.log_line(environ["REQUEST_METHOD"], path, status, started, request_id)
        # Counted as the route's answer would be (Flask's hooks never see this one).
        record = metrics_http.recorder(current_app._get_current_object())
        if record is not None:
            rule = APP_ROOT_RULE if FRONT_PATH.fullmatch(path) else APP_PATH_RULE
            record(environ["REQUEST_METHOD"], rule, status, time.monotonic() - started)
    except Exception:
        log.exception("the apps front could not log or count its answer to %s", path)
    except BaseException:
        answer.close()
        raise
    return answer


def _kept_grant(environ, username, target, slug):
    """(AppTarget, sandboxed?) that this request's credentials were allowed a moment
    ago (grants.py), else checked now; a Failure if not allowed."""
    if app_hosts.ENVIRON_KEY in environ:
        app_host = environ[app_hosts.ENVIRON_KEY]
        if app_host is None:
            raise NotFound(APP_NOT_FOUND)
        credentials = (environ.get("HTTP_WORKSPACE_SESSION_TOKEN"), *app_hosts.tokens_in(environ, _settings()))
        return grants.kept(("app-host", credentials, app_host.hostname), lambda: _checked_host_app(environ, app_host))
    token = sessions.token_in(environ)
    return grants.kept(
        ("app", token, username.lower(), target, slug), lambda: _checked_path_app(token, username, target, slug)
    )


def _checked_path_app(token, username, target, slug):
    """((the AppTarget the token may use, sandboxed?), how long that may be kept: until
    the session would be extended); a Failure if it may not."""
    database.connect(reuse_if_open=True)
    try:
        viewer, key = sessions.authenticate(token)
        app = find_app(viewer, username, target, slug)
        return (app, sandboxed(viewer, app)), sessions.seconds_before_slide(key)
    finally:
        database.close()


def _checked_host_app(environ, app_host):
    database.connect(reuse_if_open=True)
    try:
        viewer, term = host_viewer(environ, app_host)
        return (find_app(viewer, app_host.user, app_host.target, app_host.slug, on_host=True), False), term
    finally:
        database.close()
