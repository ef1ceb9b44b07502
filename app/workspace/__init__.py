"""Workspace platform (spec 000, part A): accounts, session credentials, password
sign-in and single sign-on through an external OIDC provider; workspaces, their
agents' connections, the workspace apps proxy, the web terminal and the relay.

Layers, each importing only those below it (import contracts in pyproject.toml):
routes/ (each route module defines its blueprint; init_app registers them), tunnel/
(an agent's connection, app streams, proxied requests), access/ (accounts, sessions,
OIDC, grants, limits, app-host tokens), transport/ (mux driver, websockets, mesh),
core/ (models, migrations, request schemas)."""

import logging

from app.common.db import bind_to_requests

log = logging.getLogger("bundle.workspace")


def error_body(status, message, extra):
    """Coder's shape: {message, detail?, validations?: [{field, detail}]}."""
    body = {"message": message}
    if extra.get("detail"):
        body["detail"] = extra["detail"]
    if extra.get("fields"):
        body["validations"] = [
            {"field": field, "detail": "; ".join(map(str, problems)) if isinstance(problems, list) else str(problems)}
            for field, problems in extra["fields"].items()
        ]
        if status == 400 and "validations" in body and message != "Validation failed.":
            body.setdefault("detail", message)
            body["message"] = "Validation failed."
    return body


def init_app(app):
    from app.common import readiness, redis_client
    from app.workspace.access import oidc
    from app.workspace.core.migrations import HISTORY, open_database
    from app.workspace.core.models import database
    from app.workspace.routes import agent_files, api, apps, pages, relay, terminal, workspaces
    from app.workspace.settings import WorkspaceSettings
    from app.workspace.transport.mesh import mesh
    from app.workspace.tunnel import agents

    settings = WorkspaceSettings.from_env(app.config["DATA_DIR"])
    app.config["WORKSPACE"] = settings
    open_database(settings.database_url)
    mesh.configure(redis_client.client(), settings.mesh_secret, settings.mesh_address)
    readiness.register(app, database, HISTORY, redis=True)  # before bind_to_requests: /readyz goes first
    bind_to_requests(app, database, no_connection=workspaces.NO_CONNECTION | agents.NO_CONNECTION)

    # Every route module's blueprint; pages' also serves the templates and /static.
    for module in (agent_files, agents, api, apps, oidc, pages, relay, terminal, workspaces):
        app.register_blueprint(module.bp)
    apps.install_front(app)
