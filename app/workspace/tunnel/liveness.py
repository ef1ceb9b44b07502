"""Agents' answered pings, written to the database in batches.

An agent's status is `connected` while its `last_connected_at` is recent (agents.py:
within 3 ping intervals). Written at each answered ping, that was one UPDATE per
agent per interval: 1,000 a second for 5,000 agents at the default 5 s, which ran the
worker's connection pool dry. Here a worker notes each answer in memory and writes
what it noted once per interval, a few hundred agents per statement.

The time written for a batch is the earliest answer in it: never later than what was
seen, so a batch that lands after an agent's disconnection (`disconnected_at`, written
at once) cannot make it look connected again, and the status reads at most one
interval staler than the answer (well within its 3 intervals). A stamp never moves an
agent's `last_connected_at` back (a newer connection elsewhere wrote a later one).
"""

import logging
from collections.abc import Iterable
from datetime import datetime

import gevent
from prometheus_client import Counter

from app.workspace.core.models import WorkspaceAgent, database, now

log = logging.getLogger("bundle.workspace.liveness")

# Agents per UPDATE: SQLite's bound parameters and PostgreSQL's plan stay small.
BATCH = 500
WRITES = Counter(
    "bundle_workspace_agent_liveness_writes_total",
    "Statements that wrote agents' answered pings (each covers up to 500 agents), by outcome",
    ["outcome"],
)
for _outcome in ("ok", "failed"):
    WRITES.labels(_outcome)


class Liveness:
    """This worker's answered pings not yet written: agent id -> when first answered."""

    def __init__(self) -> None:
        self._answered: dict[int, datetime] = {}
        self._writer: gevent.Greenlet | None = None
        self.interval = 5.0

    def answered(self, agent_id: int) -> None:
        """The agent answered a ping now (a Mux's on_pong)."""
        self._answered.setdefault(agent_id, now())
        if self._writer is None:
            self._writer = gevent.spawn(self._write_forever)

    def forget(self, agent_id: int) -> None:
        """The agent's connection here ended: what it answered need not be written."""
        self._answered.pop(agent_id, None)

    def write(self) -> None:
        """Write every answer noted so far (the writer's loop; a test's step)."""
        noted, self._answered = self._answered, {}
        if not noted:
            return
        stamp = min(noted.values())
        ids = list(noted)
        for start in range(0, len(ids), BATCH):
            self._write_batch(ids[start : start + BATCH], stamp)

    def _write_batch(self, ids: Iterable[int], stamp: datetime) -> None:
        try:
            with database.connection_context():
                WorkspaceAgent.update(last_connected_at=stamp).where(
                    WorkspaceAgent.id.in_(list(ids))
                    & (WorkspaceAgent.last_connected_at.is_null() | (WorkspaceAgent.last_connected_at < stamp))
                ).execute()
        except Exception as exc:  # the database away, the pool dry: the next answers are written later
            WRITES.labels("failed").inc()
            log.warning("agents' answered pings not written: %s", exc)
            return
        WRITES.labels("ok").inc()

    def _write_forever(self) -> None:
        while True:
            gevent.sleep(self.interval)
            self.write()


liveness = Liveness()
