"""The web terminal.

    GET /@<user>/<workspace>.<agent>/terminal      the page (xterm.js from /static/vendor/xterm/)
    GET /api/v2/workspaceagents/<id>/pty?reconnect=<uuid>&width=<cols>&height=<rows>   websocket

The websocket carries, up: text frames of JSON, `{"data": "<input>"}` and/or
`{"height": rows, "width": cols}` (a resize), as Coder's; binary frames are taken as
raw input. Down: binary frames of raw terminal output. A reconnect with the same
`reconnect` id re-attaches to the same shell while the agent keeps it (5 minutes
after the last detach), and first replays its recent output.

Who: the workspace's owner and site administrators (anyone else gets 404, which says
the same whether the user, the workspace or the agent exists or not). The websocket
signed in by the cookie must come from the platform's own pages (403 before the
upgrade otherwise; sessions.current_user).
"""

import uuid
from pathlib import Path

import gevent
from flask import Blueprint, render_template, request, send_from_directory
from simple_websocket import ConnectionClosed

from app.common import clientjson
from app.common.body import query_int, query_text
from app.common.failures import Failure, Invalid, NotFound
from app.common.headers import content_security_policy
from app.workspace.access import sessions
from app.workspace.core.models import database
from app.workspace.routes.apps import find_agent, page_error
from app.workspace.routes.workspaces import may_manage, may_manage_user, visible_agent
from app.workspace.transport import websocket
from app.workspace.transport.mux import StreamClosed
from app.workspace.tunnel import agents

bp = Blueprint("terminal", __name__)

VENDOR = str(Path(__file__).parent.parent / "vendor/node_modules/@xterm")
# name served -> its path below VENDOR
XTERM_FILES = {
    "xterm.js": "xterm/lib/xterm.js",
    "xterm.css": "xterm/css/xterm.css",
    "addon-fit.js": "addon-fit/lib/addon-fit.js",
}
INPUT_MESSAGE_LIMIT = 64 * 1024


@bp.get("/static/vendor/xterm/<name>")
def xterm_file(name):
    """One of xterm.js's files, served from the platform's own copy."""
    if name not in XTERM_FILES:
        raise NotFound(f"not found: {name[:80]}")
    directory, _, filename = XTERM_FILES[name].rpartition("/")
    return send_from_directory(f"{VENDOR}/{directory}", filename, max_age=3600)


@bp.get("/@<user>/<target>/terminal")
@content_security_policy(style_src_elem="'self' 'unsafe-inline'")  # xterm.js injects <style> elements
def terminal_page(user, target):
    """The web terminal page of a workspace agent."""
    try:
        viewer = sessions.current_user()
        try:
            agent = find_agent(user, target)
        except NotFound:
            if not may_manage_user(viewer, user):
                raise NotFound("Workspace agent not found.") from None  # says nothing of someone else's
            raise
        if not may_manage(viewer, agent.workspace.owner_id):
            raise NotFound("Workspace agent not found.")
    except Failure as exc:
        return page_error(exc)
    title = f"{agent.workspace.name}.{agent.name}"
    return render_template("workspace/terminal.html", agent_id=str(agent.id), title=title)


@websocket.route(bp, "/api/v2/workspaceagents/<agent_id>/pty")
def agent_pty(agent_id):
    """The web terminal's websocket: a shell in the workspace, through the agent; the same `reconnect` id
    re-attaches to it while the agent keeps it."""
    agent = visible_agent(sessions.current_user(), agent_id)
    reconnect = query_text(request.args, "reconnect", 64, required=True)
    try:
        reconnect = str(uuid.UUID(reconnect))
    except ValueError:
        raise Invalid("reconnect: must be a UUID", field="reconnect") from None
    rows = query_int(request.args, "height", 24, minimum=1, maximum=1000)
    cols = query_int(request.args, "width", 80, minimum=1, maximum=1000)
    if not websocket.is_upgrade():
        raise Invalid("This is a terminal's websocket: send a websocket upgrade request.")
    database.close()  # the terminal lasts long: no pooled database connection held
    stream = agents.open_stream(agent.id, {"kind": "pty", "reconnect": reconnect, "rows": rows, "cols": cols})
    return websocket.accept(
        lambda transport: _serve(transport, stream), "terminal", max_message_size=INPUT_MESSAGE_LIMIT
    )


def _serve(transport, stream):
    output = gevent.spawn(_output, stream, transport)
    try:
        while True:
            _input(stream, transport.receive())
    except (ConnectionClosed, StreamClosed):
        pass
    finally:
        stream.close()
        output.kill()


def _output(stream, transport):
    try:
        while True:
            data = stream.read()
            if not data:
                break
            transport.send(data)
    except (StreamClosed, ConnectionClosed, OSError):
        pass
    transport.close(1000, "the terminal session ended")


def _input(stream, message):
    if isinstance(message, bytes):
        stream.write(message)
        return
    try:
        wanted = clientjson.loads(message)
    except ValueError:
        return  # not ours: ignored rather than typed into the shell
    if not isinstance(wanted, dict):
        return
    if isinstance(wanted.get("height"), int) and isinstance(wanted.get("width"), int):
        stream.resize(max(1, min(wanted["height"], 1000)), max(1, min(wanted["width"], 1000)))
    if isinstance(wanted.get("data"), str) and wanted["data"]:
        stream.write(wanted["data"].encode())
