"""Health (200 only when the database answers), and the two public routes Open
Notebook's UI reads before anything else: its configuration (`/config`) and whether
a password is needed (`/auth/status`)."""

import logging

from flask import Blueprint
from peewee import PeeweeException
from playhouse.pool import MaxConnectionsExceeded

from app.common import readiness
from app.common.config import RELEASE
from app.common.db import bounded_read
from app.notebook.core.models import database
from app.notebook.routes.http import settings

bp = Blueprint("system", __name__)

# Views that take no connection per request (app.common.db.bind_to_requests): /config
# must say "offline" while the database is down, where taking one would answer 503.
NO_CONNECTION = frozenset({"frontend_config"})
CONFIG_CHECK_SECONDS = 2.0  # as Open Notebook's own check

log = logging.getLogger("bundle.notebook")


def _database_answers():
    try:
        database.execute_sql("SELECT 1").fetchone()
        return True
    except (PeeweeException, OSError) as exc:
        log.warning("health: the database does not answer: %s", exc)
        return False


@bp.get("/health")
def health():
    """Health: `healthy` while the database answers, else 503 `unhealthy`."""
    if _database_answers():
        return {"status": "healthy"}
    return {"status": "unhealthy", "detail": "the database does not answer"}, 503


# The bundle's tools (dev runner, tests, staging checks) wait on /healthz.
bp.add_url_rule("/healthz", "healthz", health)
bp.add_url_rule("/readyz", view_func=readiness.readyz)


@bp.get("/config")
def frontend_config():
    """Open Notebook's UI configuration: this release, no update check (nothing here asks GitHub), and whether
    the database answers. Public."""
    return {
        "version": RELEASE,
        "latestVersion": None,
        "hasUpdate": False,
        "dbStatus": "online" if _database_online() else "offline",
    }


def _database_online() -> bool:
    """A real query on a connection of its own, bounded in time: a database host that
    stopped answering is "offline" within CONFIG_CHECK_SECONDS, not after TCP's minutes."""
    try:
        with bounded_read(database, CONFIG_CHECK_SECONDS):
            database.execute_sql("SELECT 1").fetchone()
        return True
    # TimeoutError is an OSError; a pool with no connection left raises
    # MaxConnectionsExceeded, a ValueError: offline too, not a 500.
    except (PeeweeException, OSError, MaxConnectionsExceeded) as exc:
        log.warning("config: the database does not answer: %s", exc)
        return False


@bp.get("/auth/status")
def auth_status():
    """Whether the notebook asks for a password (Bearer). Public."""
    enabled = settings().auth_enabled
    return {
        "auth_enabled": enabled,
        "message": "Authentication is required" if enabled else "Authentication is disabled",
    }
