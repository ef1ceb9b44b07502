"""What a request was allowed a moment ago, kept until something that could take it
back changes: the apps proxy's front asks here before it checks a token and an app
in the database again.

Every change that can take access away calls `changed()` once it is committed and
before it answers: a session revoked (sign-out, a password reset), a workspace
deleted, an app's address reported anew by its agent. That bumps the workspace's
`access` generation (app/common/change_counter.py), shared by every worker (and host,
with Redis), and no kept grant read under an older value is used again: a revoked
token is refused by the very next request, on any worker.

A grant is also kept no longer than its own term (the caller says: a session kept
only until it would be extended) and MAX_AGE_S, which bounds what a lost bump (Redis
failing as a change was made) could leave.
"""

import time

from flask import current_app

from app.common import config
from app.common.change_counter import change_counter

MAX_AGE_S = 30.0
MAX_GRANTS = 10_000  # then all are dropped: each is rebuilt by one request

_grants: dict[object, tuple] = {}  # key -> (the app's counter, value read before computing, deadline, grant)


def _counter():
    """The app's counter, made at its first use (tests run several apps in one process)."""
    counter = current_app.extensions.get("workspace_access_generation")
    if counter is None:
        data_dir = current_app.config.get("DATA_DIR") or config.data_dir("workspace")
        counter = change_counter("workspace", "access", data_dir)
        current_app.extensions["workspace_access_generation"] = counter
    return counter


def changed():
    """Access may have been taken away (committed): every worker checks again."""
    _counter().bump()


def kept(key, compute):
    """The grant kept under `key` if nothing changed since it was computed; else
    `compute()` -> (grant, seconds it may be kept), kept. What `compute` raises (a
    refusal) is raised, never kept."""
    counter = _counter()
    seen = counter.current()
    now = time.monotonic()
    entry = _grants.get(key)
    if entry is not None and seen is not None and entry[0] is counter and entry[1] == seen and entry[2] > now:
        return entry[3]
    grant, term = compute()
    if seen is not None and term > 0:
        if len(_grants) >= MAX_GRANTS:
            _grants.clear()
        _grants[key] = (counter, seen, now + min(term, MAX_AGE_S), grant)
    return grant
