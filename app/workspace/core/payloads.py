"""Request schemas of the platform's API (marshmallow); unknown fields are errors."""

import re
from urllib.parse import urlsplit

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

USERNAME = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?$")
EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,253}\.[^@\s]{2,}$")

_username = fields.String(
    required=True, validate=validate.Regexp(USERNAME, error="must be 1 to 32 letters, digits or inner hyphens")
)
_email = fields.String(
    required=True, validate=[validate.Length(max=254), validate.Regexp(EMAIL, error="must be an email address")]
)
_name = fields.String(load_default="", validate=validate.Length(max=128))


class FirstUserSchema(Schema):
    email = _email
    username = _username
    password = fields.String(required=True, validate=validate.Length(max=256))
    name = _name


class CreateUserSchema(Schema):
    email = _email
    username = _username
    password = fields.String(validate=validate.Length(max=256))
    name = _name
    login_type = fields.String(load_default="password", validate=validate.OneOf(("password", "oidc", "none")))


class LoginSchema(Schema):
    email = fields.String(required=True, validate=validate.Length(min=1, max=254))
    password = fields.String(required=True, validate=validate.Length(min=1, max=256))


# --------------------------------------------------------------------------- workspaces, agents, apps

# DNS-label-like: workspace, agent and app names appear in paths as `<workspace>.<agent>`.
NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
NAME_RULE = "must be 1 to 32 lower-case letters, digits or hyphens, not starting or ending with a hyphen"
SHARING_LEVELS = ("owner", "authenticated")


def _dns_name():
    return fields.String(required=True, validate=validate.Regexp(NAME, error=NAME_RULE))


def check_app_url(value):
    parts = urlsplit(value)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValidationError("must be http://<host>:<port> of the app inside the workspace")
    try:
        _ = parts.port  # reading it raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise ValidationError("has an invalid port") from None


def _unique(items, key, field):
    names = [item[key] for item in items]
    if len(names) != len(set(names)):
        raise ValidationError(f"each {key} must be unique", field)


class AppSchema(Schema):
    slug = _dns_name()
    display_name = fields.String(load_default=None, validate=validate.Length(min=1, max=64))
    url = fields.String(required=True, validate=[validate.Length(max=256), check_app_url])
    sharing_level = fields.String(load_default="owner", validate=validate.OneOf(SHARING_LEVELS))


class AgentSchema(Schema):
    name = _dns_name()
    apps = fields.List(fields.Nested(AppSchema), load_default=list, validate=validate.Length(max=32))

    @validates_schema
    def distinct_slugs(self, data, **kwargs):
        _unique(data["apps"], "slug", "apps")


class CreateWorkspaceSchema(Schema):
    name = _dns_name()
    agents = fields.List(fields.Nested(AgentSchema), required=True, validate=validate.Length(min=1, max=8))

    @validates_schema
    def distinct_agents(self, data, **kwargs):
        _unique(data["agents"], "name", "agents")


def valid_app_report(app):
    """(slug, url) of an app the agent reports, or (None, None) when it is not valid."""
    try:
        data = AppSchema().load({"slug": app.get("slug"), "url": app.get("url")})
    except (ValidationError, AttributeError):
        return None, None
    return data["slug"], data["url"].rstrip("/")
