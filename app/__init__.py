"""The bundle: one Flask application factory for five services.

`create_app(service)` builds the app of one service. Shared mechanisms live in
`app.common`; each service is a package `app.<service>` that exposes
`init_app(app)`.
"""

import importlib
import importlib.util

from app import registry
from app.common import config

# Every service the bundle will have: the registry's names (services.json), in its order.
SERVICES = registry.NAMES


class UnknownService(ValueError):
    pass


def built_services():
    """The services whose package exists in this checkout."""
    return [s for s in SERVICES if importlib.util.find_spec(f"app.{s}") is not None]


def create_app(service, overrides=None):
    """Build the Flask app of `service`; `overrides` update its config (tests)."""
    if service not in SERVICES:
        raise UnknownService(f"unknown SERVICE {service!r}: expected one of {', '.join(SERVICES)}")
    if service not in built_services():
        raise UnknownService(
            f"SERVICE {service!r} is not built in this checkout: available are {', '.join(built_services())}"
        )
    # Flask is imported here, not with the package: a job worker imports app.<service>
    # modules without it.
    from flask import Flask

    from app.common import errors, headers, live_processes, metrics, metrics_http, readiness, redis_client, requestlog

    redis_client.client()  # a malformed REDIS_URL stops the start here, with one line naming it
    module = importlib.import_module(f"app.{service}")
    # Static files are served by each service's blueprint, not by the app itself.
    flask_app = Flask(module.__name__, static_folder=None)
    flask_app.json.sort_keys = False  # keep fields in the order the service builds them
    flask_app.config["SERVICE"] = service
    flask_app.config["DATA_DIR"] = config.data_dir(service)
    flask_app.config.update(overrides or {})
    metrics_http.register(flask_app)  # /metrics and the request metrics: its hooks first, to time every request
    errors.register(flask_app, module.error_body)
    requestlog.register(flask_app)
    headers.register(flask_app)  # CSP, nosniff, framing and referrer rules on every answer
    module.init_app(flask_app)
    checks = flask_app.extensions.get(readiness.EXTENSION)
    metrics.build_info(live_processes.RELEASE, checks.required_versions if checks is not None else ())
    return flask_app
