"""Request helpers of the notebook's routes: settings, bodies, query strings."""
from flask import current_app, request
from marshmallow import EXCLUDE

from app.common.body import json_object, validated


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
    return validated(schema_class(unknown=EXCLUDE), request.args.to_dict())
