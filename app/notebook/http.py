"""Request helpers of the notebook's routes: settings, bodies, query strings."""
from flask import current_app, request
from marshmallow import EXCLUDE

from app.common.body import json_object, validated
from app.common.failures import Invalid


def settings():
    return current_app.config["NOTEBOOK"]


def jobs():
    return current_app.extensions["notebook_jobs"]


def body(schema):
    """The JSON body, validated by `schema` (an instance)."""
    return validated(schema, json_object(settings().max_text_bytes))


def query(schema_class):
    """The query string through `schema_class`; unknown parameters (cache busters)
    are left out, known ones are checked."""
    args = request.args.to_dict()
    for name, value in args.items():
        if "\x00" in name or "\x00" in value:
            raise Invalid(f"{name[:40]!r}: must not contain NUL characters", field=name[:40])
    return validated(schema_class(unknown=EXCLUDE), args)
