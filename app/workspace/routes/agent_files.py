"""What the platform hands out to put an agent in a workspace, as Coder does with its
/bin/ route and per-agent init script:

    GET  /bin/workspace-agent.pyz          the agent program (workspace_agent/ and
                                           workspace_protocol/ in one zipapp: Python's
                                           standard library only, any architecture)
    GET  /bin/workspace-agent.pyz.sha256   its SHA-256, as `sha256sum` prints it
    GET  /api/v2/init-script               a POSIX sh script that fetches the file over
                                           this origin, checks the digest and runs the
                                           agent, again whenever it stops; the token
                                           comes from WORKSPACE_AGENT_TOKEN
    POST /api/v2/workspaceagents/<id>/init-script
                                           (the owner's session) the same script with a
                                           newly minted token in it; the old token stops
                                           working

A workspace template runs one line:

    curl -fsSL https://workspace.example.org/api/v2/init-script | WORKSPACE_AGENT_TOKEN=... sh -s -- --app code=http://127.0.0.1:8080

The zipapp is built from the checkout once per process, byte for byte the same on
every worker and host (fixed timestamps and order), so its digest is the same
everywhere. A token never goes in a URL, and the scripts never print it.
"""

import functools
import hashlib
import io
import zipfile

from flask import Blueprint, Response, current_app, request

from app.common.config import PROJECT_ROOT
from app.workspace.access import sessions
from app.workspace.core.models import audit
from app.workspace.routes.workspaces import visible_agent
from app.workspace.settings import VERSION
from app.workspace.tunnel import agents
from workspace_protocol.mux import OUTDATED_EXIT
from workspace_protocol.mux import VERSION as PROTOCOL_VERSION

bp = Blueprint("agent_files", __name__)

FILE_NAME = "workspace-agent.pyz"
PACKAGES = ("workspace_agent", "workspace_protocol")
MAIN = b"import sys\nfrom workspace_agent.__main__ import main\nsys.exit(main(sys.argv[1:]))\n"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
SCRIPT = (PROJECT_ROOT / "app/workspace/templates/init-script.sh").read_text()


class AgentFile:
    def __init__(self, data):
        self.data = data
        self.sha256 = hashlib.sha256(data).hexdigest()


@functools.cache
def agent_file():
    """The zipapp: a shebang, then __main__.py, VERSION and the two packages' modules."""
    entries = [("__main__.py", MAIN), ("workspace_agent/VERSION", VERSION.encode() + b"\n")]
    for package in PACKAGES:
        for path in sorted((PROJECT_ROOT / package).glob("*.py")):
            entries.append((f"{package}/{path.name}", path.read_bytes()))
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return AgentFile(buffer.getvalue())


def agent_info():
    """What /api/v2/buildinfo says of the agent."""
    settings = current_app.config["WORKSPACE"]
    return {
        "version": VERSION,
        "protocol_version": PROTOCOL_VERSION,
        "sha256": agent_file().sha256,
        "url": f"{settings.access_url}/bin/{FILE_NAME}",
    }


@bp.get(f"/bin/{FILE_NAME}")
def download_agent():
    """The agent program (a zipapp), with its SHA-256 as ETag (304 when unchanged)."""
    built = agent_file()
    etag = f'"{built.sha256}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-SHA256": built.sha256}
    if etag in request.headers.get("If-None-Match", ""):
        return Response(status=304, headers=headers)
    return Response(
        built.data,
        mimetype="application/octet-stream",
        headers={**headers, "Content-Disposition": f"attachment; filename={FILE_NAME}"},
    )


@bp.get(f"/bin/{FILE_NAME}.sha256")
def agent_digest():
    """The agent program's SHA-256, in `sha256sum`'s format."""
    return Response(
        f"{agent_file().sha256}  {FILE_NAME}\n", mimetype="text/plain", headers={"Cache-Control": "no-cache"}
    )


def init_script(token=None):
    """The init script; with `token`, one that carries it (else it reads the environment's)."""
    settings = current_app.config["WORKSPACE"]
    carried = f"WORKSPACE_AGENT_TOKEN='{token}'\n" if token else ""
    text = (
        SCRIPT.replace("@ACCESS_URL@", _quoted(settings.access_url))
        .replace("@TOKEN@\n", carried)
        .replace("@FILE_NAME@", FILE_NAME)
        .replace("@OUTDATED@", str(OUTDATED_EXIT))
    )
    return Response(
        text,
        mimetype="text/x-shellscript",
        headers={"Cache-Control": "no-store", "Content-Disposition": "inline; filename=init-script.sh"},
    )


def _quoted(value):
    """`value` inside single quotes of a sh script."""
    return value.replace("'", "'\\''")


@bp.get("/api/v2/init-script")
def public_init_script():
    """The shell script that fetches, checks and starts the agent; it reads the agent's token from the environment."""
    return init_script()


@bp.post("/api/v2/workspaceagents/<agent_id>/init-script")
def minted_init_script(agent_id):
    """An init script that carries a new token of the agent (the old one is revoked)."""
    actor = sessions.current_user()
    agent = visible_agent(actor, agent_id)
    token = agents.rotate_token(agent)
    audit("workspace_agent.init_script", actor, actor=actor.username, agent=str(agent.id))
    return init_script(token)
