"""Workspace platform (spec 000, part A): accounts, session credentials, password
sign-in and single sign-on through an external OIDC provider; workspaces, their
agents' connections, the workspace apps proxy, the web terminal and the relay."""
import logging

from flask import Blueprint

from app.common.config import PROJECT_ROOT
from app.common.db import bind_to_requests

bp = Blueprint("workspace", __name__, template_folder="templates", static_folder="static",
               static_url_path="/static")
log = logging.getLogger("bundle.workspace")
VERSION = (PROJECT_ROOT / "VERSION").read_text().strip()


def error_body(status, message, extra):
    """Coder's shape: {message, detail?, validations?: [{field, detail}]}."""
    body = {"message": message}
    if extra.get("detail"):
        body["detail"] = extra["detail"]
    if extra.get("fields"):
        body["validations"] = [{"field": field, "detail": "; ".join(map(str, problems))
                                if isinstance(problems, list) else str(problems)}
                               for field, problems in extra["fields"].items()]
        if status == 400 and "validations" in body and message != "Validation failed.":
            body.setdefault("detail", message)
            body["message"] = "Validation failed."
    return body


def init_app(app):
    # Importing the route modules registers their routes on bp.
    from app.common import redis_client
    from app.workspace import (  # noqa: F401
        agent_files,
        agents,
        api,
        apps,
        oidc,
        pages,
        relay,
        terminal,
        workspaces,
    )
    from app.workspace.mesh import mesh
    from app.workspace.models import database
    from app.workspace.schema import open_database
    from app.workspace.settings import WorkspaceSettings

    settings = WorkspaceSettings.from_env(app.config["DATA_DIR"])
    app.config["WORKSPACE"] = settings
    open_database(settings.database_url)
    mesh.configure(redis_client.client(), settings.mesh_secret, settings.mesh_address)
    bind_to_requests(app, database)

    app.register_blueprint(bp)
    apps.install_front(app)
