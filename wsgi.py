"""The WSGI entry point: `SERVICE` names the service to serve.

SERVICE=decks .venv/bin/gunicorn -c gunicorn.conf.py wsgi:app
"""

import os
import sys

from app import UnknownService, create_app
from app.common import lifecycle
from app.common.config import ConfigError

try:
    app = create_app(os.environ.get("SERVICE", "").strip())
except (UnknownService, ConfigError) as exc:  # a schema newer than the code (SchemaTooNew) too
    sys.stderr.write(f"error: {exc}\n")
    sys.exit(3)  # gunicorn's arbiter stops instead of respawning the worker forever

lifecycle.install()
