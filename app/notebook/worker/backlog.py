"""The job queue's backlog as /metrics shows it, read from the commands table when a
web worker answers a scrape: the job worker is a process of its own without a
/metrics, and every job is a `Command` row (its status is the job's state), whichever
storage huey queues it on.

    bundle_notebook_jobs{state="queued"|"running"|"failed"}   commands in that state now
    bundle_notebook_oldest_queued_job_age_seconds              age of the oldest queued one (0: none)

A scrape takes no connection of its own (app.common.db.bind_to_requests): this
collector takes one, and gives up after app.common.db.BOUNDED_READ_SECONDS (an
exhausted pool, a migration's lock, a database that does not answer), when the scrape
shows neither (logged) and everything else it holds."""

import logging

from peewee import fn
from prometheus_client.core import GaugeMetricFamily

from app.common.db import bounded_read
from app.notebook.core.models import Command, database, now

log = logging.getLogger("bundle.notebook")

# The metric's state -> the command's status.
STATES = {"queued": "new", "running": "running", "failed": "failed"}


def read_backlog():
    """({status: count} of the commands in STATES, the oldest queued command's creation
    time or None)."""
    with bounded_read(database):
        counts = dict(
            Command.select(Command.status, fn.COUNT(Command.id))
            .where(Command.status.in_(list(STATES.values())))
            .group_by(Command.status)
            .tuples()
        )
        oldest = (
            Command.select(Command.created)
            .where(Command.status == STATES["queued"])
            .order_by(Command.created)
            .limit(1)
            .first()
        )
    return counts, oldest.created if oldest is not None else None


class JobBacklog:
    """A prometheus_client collector (app.common.metrics.on_scrape) of the backlog."""

    def collect(self):
        try:
            counts, oldest = read_backlog()
        except Exception as exc:  # the database's error, whichever database
            log.warning("the job backlog could not be read for /metrics: %s: %s", type(exc).__name__, exc)
            return
        jobs = GaugeMetricFamily(
            "bundle_notebook_jobs",
            "Background jobs (commands) by state: queued, running, failed (those the commands table still holds)",
            labels=["state"],
        )
        for state, status in STATES.items():
            jobs.add_metric([state], counts.get(status, 0))
        yield jobs
        age = max(0.0, (now() - oldest).total_seconds()) if oldest is not None else 0.0
        yield GaugeMetricFamily(
            "bundle_notebook_oldest_queued_job_age_seconds",
            "Age of the oldest job waiting for the job worker (0 when none waits)",
            value=age,
        )


backlog = JobBacklog()
