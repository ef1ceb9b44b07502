"""Readiness: whether this worker can serve a request now, answered at `/readyz`.

`/healthz` is liveness (the process answers); `/readyz` says whether a request sent
now would be served. 200 `{"status": "ready", "checks": {name: "ok"}}`, else 503
`{"status": "unavailable", "failing": <the first check that fails>, "checks": {name:
"ok" | why}}` with Retry-After. The checks, in this order, each where it applies:

- `stopping`: the worker was told to stop (SIGTERM: a stop, a restart, a reload) and
  drains; requests on its kept-alive connections still arrive meanwhile;
- `data`: DATA_DIR is a folder the process may write in (or, not made yet, may make);
- `database`: the service's database answers `SELECT 1` through its pool within
  CHECK_SECONDS, and its schema is not behind the code: every expand step of the
  service's history is recorded (`schema_migrations` or `schema_expansions`). A contract step waits until
  every host runs the new code, so a pending one leaves the service ready; a database
  newer than the code is not behind either;
- `redis`: in a service that uses Redis, when REDIS_URL is set, PING answers within
  CHECK_SECONDS.

Nothing is cached and no outside provider is asked: each answer is fresh and costs a
few round trips to the database and Redis at most. Each service wires it in two lines:

    readiness.register(app, database, HISTORY, redis=True)   # init_app, before bind_to_requests
    bp.add_url_rule("/readyz", view_func=readiness.readyz)    # its route module

`register` goes before `bind_to_requests` (app.common.db): its hook answers `/readyz`
ahead of the per-request database connection, which, with the database down, would
otherwise fail the request with the service's generic 503 before the checks could say
which one fails.
"""

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import gevent
from flask import Flask, Response, current_app, jsonify, request
from peewee import DatabaseProxy

from app.common import lifecycle, redis_client
from app.common.migrations import History, recorded_versions

log = logging.getLogger("bundle.readiness")
_T = TypeVar("_T")

# The longest a check waits for the database or Redis: a readiness answer is quick.
CHECK_SECONDS = 2.0
# What a 503 tells a client to wait before it asks again.
RETRY_AFTER_SECONDS = 2
OK = "ok"
EXTENSION = "readiness"


@dataclass(frozen=True)
class Readiness:
    """What a service's `/readyz` checks (app.extensions["readiness"])."""

    data_dir: str
    database: DatabaseProxy | None = None
    # The schema versions the code needs recorded: the history's expand steps.
    required_versions: frozenset[int] = frozenset()
    redis: bool = False

    def checks(self) -> dict[str, str]:
        """{check: "ok" | why not}, each check run now, in the order of the module's list."""
        results = {"stopping": "the worker is stopping (SIGTERM)" if lifecycle.stopping() else OK}
        results["data"] = _guarded("data", data_problem, self.data_dir)
        if self.database is not None:
            results["database"] = _guarded("database", database_problem, self.database, self.required_versions)
        if self.redis and redis_client.configured_url():
            results["redis"] = _guarded("redis", redis_problem)
        return results


def register(
    app: Flask, database: DatabaseProxy | None = None, history: History | None = None, *, redis: bool = False
) -> None:
    """Give `app` its readiness checks: DATA_DIR, the `database` proxy with its schema
    `history`, Redis when `redis` (the service uses REDIS_URL when it is set). Call it
    before `bind_to_requests`; the route module adds the `/readyz` rule (`readyz`)."""
    app.extensions[EXTENSION] = Readiness(
        data_dir=app.config["DATA_DIR"],
        database=database,
        required_versions=required_versions(history) if history is not None else frozenset(),
        redis=redis,
    )
    app.before_request(_answer_first)


def readyz() -> Response:
    """Readiness: 200 `ready` while this worker can serve, else 503 `unavailable` naming
    the `failing` check (`stopping`, `data`, `database`, `redis`), with each check's state.

    `/healthz` stays the liveness answer. Nothing is cached and no outside provider is asked."""
    return _answer()


def required_versions(history: History) -> frozenset[int]:
    """The versions of `history`'s expand steps (a step without a phase is one): what
    the database must have recorded for this code to serve."""
    return frozenset(step.version for step in history.steps if _phase(step) == "expand")


def _phase(step: object) -> object:
    """The step's phase, "expand" or "contract" (an enum's value too)."""
    phase = getattr(step, "phase", "expand")
    return getattr(phase, "value", phase)


def data_problem(data_dir: str) -> str | None:
    """Why DATA_DIR cannot take the service's files, or None. A DATA_DIR not made yet
    (it is made lazily) is fine when the nearest folder above it is writable."""
    path = Path(data_dir)
    while not path.exists() and path.parent != path:
        path = path.parent
    what = "DATA_DIR" if path == Path(data_dir) else "the folder DATA_DIR is to be made in"
    if not path.is_dir():
        return f"{what} is not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{what} is not writable by this process"
    return None


def database_problem(proxy: DatabaseProxy, required: frozenset[int], seconds: float = CHECK_SECONDS) -> str | None:
    """Why the database behind `proxy` cannot serve this code, or None: it does not
    answer within `seconds`, or a version in `required` is not recorded."""
    applied, problem = _answer_within(seconds, lambda: _applied_versions(proxy))
    if applied is None:
        return problem
    missing = sorted(required - applied)
    if missing:
        return f"the schema is behind the code: step {', '.join(map(str, missing))} not applied"
    return None


def redis_problem(seconds: float = CHECK_SECONDS) -> str | None:
    """Why Redis (REDIS_URL) does not answer a PING within `seconds`, or None."""
    client = redis_client.client()
    if client is None:
        return None
    # redis-py drops a connection that failed or was interrupted mid-command.
    return _answer_within(seconds, client.ping)[1]


def _answer_within(seconds: float, ask: Callable[[], _T]) -> tuple[_T | None, str | None]:
    """(what `ask()` answered, None), or (None, why not): no answer within `seconds`
    (gevent's time-out, this call's only), or the error it raised, in a few words
    (its first line: the drivers put no URL nor password in their messages)."""
    timer = gevent.Timeout(seconds)
    try:
        with timer:
            return ask(), None
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        return None, f"no answer within {seconds:g} s"
    except Exception as exc:
        return None, f"does not answer: {redis_client.describe(exc)}"


def _applied_versions(proxy: DatabaseProxy) -> frozenset[int]:
    """The recorded schema versions, on a connection taken here: one that fails (or
    is cut off by the time-out, busy mid-query) is discarded, never handed back to the
    pool; the driver's own error is what the caller reports."""
    opened_here = proxy.is_closed()
    if opened_here:
        proxy.connect()
    try:
        proxy.execute_sql("SELECT 1").fetchone()
        versions = recorded_versions(proxy.obj)
    except BaseException:
        _discard_connection(proxy)
        raise
    if opened_here:
        proxy.close()
    return versions


def _discard_connection(proxy: DatabaseProxy) -> None:
    """Close this greenlet's connection without handing it back to the pool: a query
    cut off by the time-out may have left it busy."""
    manual_close: Callable[[], object] | None = getattr(proxy.obj, "manual_close", None)
    try:
        if manual_close is not None:
            manual_close()
        else:
            proxy.close()
    except Exception as exc:
        log.debug("readiness: closing a failed connection: %s", redis_client.describe(exc))


def _guarded(name: str, check: Callable[..., str | None], *args: Any) -> str:
    """The check's answer ("ok" or why not); a check that fails unexpectedly is a failing check."""
    try:
        problem = check(*args)
    except Exception as exc:
        log.exception("readiness: the %s check failed", name)
        problem = f"the check failed: {type(exc).__name__}"
    if problem is not None:
        log.warning("not ready: %s: %s", name, problem)
    return OK if problem is None else problem


def _answer_first() -> Response | None:
    """The readiness answer, ahead of the hooks registered after `register` (the
    per-request database connection among them)."""
    if request.endpoint is not None and current_app.view_functions.get(request.endpoint) is readyz:
        return _answer()
    return None


def _answer() -> Response:
    setup: Readiness | None = current_app.extensions.get(EXTENSION)
    if setup is None:
        raise RuntimeError("readiness.register(app) was not called in the service's init_app")
    checks = setup.checks()
    failing = next((name for name, state in checks.items() if state != OK), None)
    body: dict[str, Any] = (
        {"status": "ready", "checks": checks}
        if failing is None
        else {"status": "unavailable", "failing": failing, "checks": checks}
    )
    response = jsonify(body)
    response.headers["Cache-Control"] = "no-store"
    if failing is not None:
        response.status_code = 503
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response
