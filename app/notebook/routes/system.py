"""Health: 200 only when the database answers."""

import logging

from flask import Blueprint
from peewee import PeeweeException

from app.common import readiness
from app.notebook.core.models import database

bp = Blueprint("system", __name__)

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
