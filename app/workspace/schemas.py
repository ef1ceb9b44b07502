"""Request schemas of the platform's API (marshmallow); unknown fields are errors."""
import re

from marshmallow import Schema, fields, validate

USERNAME = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?$")
EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,253}\.[^@\s]{2,}$")

_username = fields.String(required=True, validate=validate.Regexp(
    USERNAME, error="must be 1 to 32 letters, digits or inner hyphens"))
_email = fields.String(required=True, validate=[validate.Length(max=254), validate.Regexp(
    EMAIL, error="must be an email address")])
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
