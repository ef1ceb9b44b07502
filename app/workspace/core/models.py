"""The platform's data (peewee): organizations, users, memberships, session
tokens, OIDC links, an audit log, and workspaces with their agents and apps.
The schema is made and migrated at start-up (app/workspace/core/migrations.py)."""

import uuid
from datetime import UTC, datetime

from peewee import BooleanField, CharField, DatabaseProxy, DateTimeField, ForeignKeyField, Model, TextField, UUIDField

from app.common.db import JSONField

database = DatabaseProxy()


def now():
    return datetime.now(UTC).replace(tzinfo=None)  # stored as naive UTC


class BaseModel(Model):
    class Meta:
        database = database


class Organization(BaseModel):
    id = UUIDField(primary_key=True, default=uuid.uuid4)
    name = CharField(unique=True)
    is_default = BooleanField(default=False)
    created_at = DateTimeField(default=now)


class User(BaseModel):
    id = UUIDField(primary_key=True, default=uuid.uuid4)
    username = CharField()
    username_key = CharField(unique=True)  # lower case: names differing only in case are one name
    email = CharField()
    email_key = CharField(unique=True)  # lower case
    name = CharField(default="")
    password_hash = TextField(null=True)
    login_type = CharField(default="password")  # password | oidc | none
    status = CharField(default="active")
    roles = JSONField(default=list)  # site roles: owner, user-admin
    created_at = DateTimeField(default=now)
    updated_at = DateTimeField(default=now)


class Membership(BaseModel):
    user = ForeignKeyField(User, backref="memberships", on_delete="CASCADE")
    organization = ForeignKeyField(Organization, backref="members", on_delete="CASCADE")
    roles = JSONField(default=list)

    class Meta:
        indexes = ((("user", "organization"), True),)


class ApiKey(BaseModel):
    """A session token `<id>-<secret>`: only a SHA-256 of the secret is stored."""

    id = CharField(primary_key=True, max_length=10)
    user = ForeignKeyField(User, backref="api_keys", on_delete="CASCADE")
    secret_hash = CharField()
    login_type = CharField()
    created_at = DateTimeField(default=now)
    expires_at = DateTimeField()
    last_used = DateTimeField(default=now)
    revoked_at = DateTimeField(null=True)


class OidcLink(BaseModel):
    user = ForeignKeyField(User, backref="oidc_links", on_delete="CASCADE")
    issuer = CharField()
    subject = CharField()
    created_at = DateTimeField(default=now)

    class Meta:
        indexes = ((("issuer", "subject"), True),)


class AuditLog(BaseModel):
    time = DateTimeField(default=now)
    action = CharField()
    user = ForeignKeyField(User, null=True, backref="audit", on_delete="SET NULL")
    actor = CharField(default="")
    detail = JSONField(default=dict)


class Singleton(BaseModel):
    """Claims that may be made once, ever (the first user): a unique key makes a
    second claim fail, whatever the number of workers."""

    key = CharField(primary_key=True)
    created_at = DateTimeField(default=now)


class Workspace(BaseModel):
    id = UUIDField(primary_key=True, default=uuid.uuid4)
    owner = ForeignKeyField(User, backref="workspaces", on_delete="CASCADE")
    name = CharField()
    created_at = DateTimeField(default=now)

    class Meta:
        indexes = ((("owner", "name"), True),)


class WorkspaceAgent(BaseModel):
    """An agent of a workspace. Its token is `<token_id>-<secret>`: only a SHA-256 of
    the secret is stored. Status comes from the connection timestamps (agents.status_of)."""

    id = UUIDField(primary_key=True, default=uuid.uuid4)
    workspace = ForeignKeyField(Workspace, backref="agents", on_delete="CASCADE")
    name = CharField()
    token_id = CharField(unique=True, max_length=10)
    token_hash = CharField()
    created_at = DateTimeField(default=now)
    first_connected_at = DateTimeField(null=True)
    last_connected_at = DateTimeField(null=True)  # at the upgrade, then answered pings (tunnel/liveness.py)
    disconnected_at = DateTimeField(null=True)

    class Meta:
        indexes = ((("workspace", "name"), True),)


class WorkspaceApp(BaseModel):
    """An app the agent reaches inside the workspace (declared at creation, or
    reported by the agent's --app)."""

    agent = ForeignKeyField(WorkspaceAgent, backref="apps", on_delete="CASCADE")
    slug = CharField()
    display_name = CharField()
    url = CharField()
    sharing_level = CharField(default="owner")  # owner | authenticated

    class Meta:
        indexes = ((("agent", "slug"), True),)


MODELS = [
    Organization,
    User,
    Membership,
    ApiKey,
    OidcLink,
    AuditLog,
    Singleton,
    Workspace,
    WorkspaceAgent,
    WorkspaceApp,
]
DEFAULT_ORGANIZATION = "default"


def audit(action, user=None, actor="", **detail):
    AuditLog.create(action=action, user=user, actor=actor, detail=detail)
