"""Workspaces API (session token):

    POST   /api/v2/users/<user>/workspaces        {name, agents: [{name, apps: [...]}]} -> 201, tokens once
    GET    /api/v2/users/<user>/workspaces
    GET    /api/v2/workspaces/<id>
    DELETE /api/v2/workspaces/<id>                revokes its agents' tokens, closes their connections
    GET    /api/v2/workspaceagents/<id>
    POST   /api/v2/workspaceagents/<id>/token     a new agent token; the old one stops working

`<user>` is a username or `me`. Administrators (site roles owner, user-admin) see
and manage every workspace; anyone else only their own, and someone else's is 404.
"""

import uuid

from flask import Blueprint, current_app, jsonify
from peewee import IntegrityError

from app.common.body import json_object, validated
from app.common.db import connection_for_block
from app.common.failures import Conflict, NotFound
from app.workspace.access import accounts, grants, sessions
from app.workspace.core.models import User, Workspace, WorkspaceAgent, WorkspaceApp, audit, database
from app.workspace.core.payloads import CreateWorkspaceSchema
from app.workspace.tunnel import agents

bp = Blueprint("workspaces", __name__)
# Views that take no database connection per request (app.common.db.bind_to_requests),
# but one per block that reads: the status stream, of which a reconnect storm opens
# thousands at once.
NO_CONNECTION = frozenset({"watch_agent_statuses"})

BODY_LIMIT = 64 * 1024


# --------------------------------------------------------------------------- access


def _settings():
    return current_app.config["WORKSPACE"]


def _not_found(what):
    return NotFound(f"{what} not found.")


def may_manage(user, owner_id):
    return str(owner_id) == str(user.id) or accounts.is_admin(user)


def may_manage_user(actor, username: str) -> bool:
    """Whether `actor` may see the workspaces of the user named `username` (existing or not)."""
    return actor.username.lower() == username.lower() or accounts.is_admin(actor)


def target_user(actor, name):
    """The user a `/users/<user>/...` path names, if the actor may see it; else 404."""
    if name == "me":
        return actor
    user = User.get_or_none(User.username_key == name.lower())
    if user is None or not may_manage(actor, user.id):
        raise _not_found("User")
    return user


def _uuid(value, what):
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _not_found(what) from None


def visible_workspace(user, workspace_id):
    workspace = Workspace.get_or_none(Workspace.id == _uuid(workspace_id, "Workspace"))
    if workspace is None or not may_manage(user, workspace.owner_id):
        raise _not_found("Workspace")
    return workspace


def visible_agent(user, agent_id):
    agent = (
        WorkspaceAgent.select(WorkspaceAgent, Workspace)
        .join(Workspace)
        .where(WorkspaceAgent.id == _uuid(agent_id, "Agent"))
        .first()
    )
    if agent is None or not may_manage(user, agent.workspace.owner_id):
        raise _not_found("Agent")
    return agent


# --------------------------------------------------------------------------- shapes


def public_workspace(workspace, tokens=None):
    settings = _settings()
    owner = workspace.owner
    shown = []
    for agent in workspace.agents.order_by(WorkspaceAgent.name):
        item = agents.public(agent, settings, workspace, owner.username)
        if tokens:
            item["token"] = tokens[agent.name]
        shown.append(item)
    return {
        "id": str(workspace.id),
        "name": workspace.name,
        "owner_id": str(owner.id),
        "owner_name": owner.username,
        "created_at": workspace.created_at.isoformat(timespec="seconds") + "Z",
        "agents": shown,
    }


# --------------------------------------------------------------------------- routes


@bp.post("/api/v2/users/<user>/workspaces")
def create_workspace(user):
    """Create a workspace with its agents and apps (201), each agent's token shown this one time."""
    actor = sessions.current_user()
    owner = target_user(actor, user)
    data = validated(CreateWorkspaceSchema(), json_object(BODY_LIMIT))
    if Workspace.select().where((Workspace.owner == owner.id) & (Workspace.name == data["name"])).exists():
        raise _conflict(data["name"])
    tokens = {}
    try:
        with database.atomic():
            workspace = Workspace.create(owner=owner.id, name=data["name"])
            for spec in data["agents"]:
                tokens[spec["name"]] = _create_agent(workspace, spec)
            audit("workspace.create", owner, actor=actor.username, workspace=workspace.name)
    except IntegrityError:
        raise _conflict(data["name"]) from None
    return public_workspace(workspace, tokens), 201


def _conflict(name):
    return Conflict(f"A workspace named {name!r} already exists.", fields={"name": ["is taken"]})


def _create_agent(workspace, spec):
    token_id, token_hash, token = sessions.new_token()
    agent = WorkspaceAgent.create(workspace=workspace, name=spec["name"], token_id=token_id, token_hash=token_hash)
    for app in spec["apps"]:
        WorkspaceApp.create(
            agent=agent,
            slug=app["slug"],
            display_name=app["display_name"] or app["slug"],
            url=app["url"].rstrip("/"),
            sharing_level=app["sharing_level"],
        )
    return token


def owned_workspaces(owner):
    found = Workspace.select().where(Workspace.owner == owner.id).order_by(Workspace.name)
    return [public_workspace(workspace) for workspace in found]


@bp.get("/api/v2/users/<user>/workspaces")
def list_workspaces(user):
    """A user's workspaces (`me` or a username; administrators may name others)."""
    return jsonify(owned_workspaces(target_user(sessions.current_user(), user)))


@bp.get("/api/v2/workspaces/<workspace_id>")
def get_workspace(workspace_id):
    """One workspace with its agents and their state."""
    return public_workspace(visible_workspace(sessions.current_user(), workspace_id))


@bp.delete("/api/v2/workspaces/<workspace_id>")
def delete_workspace(workspace_id):
    """Delete a workspace and its agents (204); their connections are closed."""
    actor = sessions.current_user()
    workspace = visible_workspace(actor, workspace_id)
    agent_ids = [agent.id for agent in workspace.agents]
    with database.atomic():
        workspace.delete_instance(recursive=True)
        audit("workspace.delete", actor, actor=actor.username, workspace=workspace.name)
    grants.changed()
    for agent_id in agent_ids:
        agents.disconnect(agent_id, "the workspace was deleted")
    return "", 204


@bp.get("/api/v2/workspaceagents/<agent_id>")
def get_agent(agent_id):
    """One workspace agent: its state, apps and connection times."""
    agent = visible_agent(sessions.current_user(), agent_id)
    return agents.public(agent, _settings())


@bp.post("/api/v2/workspaceagents/<agent_id>/token")
def rotate_agent_token(agent_id):
    """Give an agent a new token (201), shown this one time; the old one stops working."""
    actor = sessions.current_user()
    agent = visible_agent(actor, agent_id)
    token = agents.rotate_token(agent)
    audit("workspace_agent.token_rotated", actor, actor=actor.username, agent=str(agent.id))
    return {"token": token}, 201


@bp.get("/api/v2/users/me/workspaces/watch")
def watch_agent_statuses():
    """SSE: the current status of each of the user's agents, then every change."""
    from app.common.broker import broker
    from app.common.sse import stream_response

    # A database connection for each read only (NO_CONNECTION): none while it
    # subscribes (which may wait on Redis), none while it streams.
    with connection_for_block(database):
        user = sessions.current_user()
    subscription = broker.subscribe(agents.status_topic(user.id))  # before the snapshot: no change is missed
    try:
        settings = _settings()
        with connection_for_block(database):
            snapshot = [
                {"agent_id": str(agent.id), "status": agents.status_of(agent, settings)}
                for agent in WorkspaceAgent.select().join(Workspace).where(Workspace.owner == user.id)
            ]
    except BaseException:
        subscription.close()
        raise
    return stream_response(snapshot, subscription)
