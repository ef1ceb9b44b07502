"""The outcome of each `create`, where Prometheus reads it: a textfile of the node
exporter's collector (BACKUP_STATUS_FILE), rewritten whole and renamed into place.
A failed run keeps the time of the last success, so BackupTooOld counts from it."""

from __future__ import annotations

import os
import re
import time

STORE = "files"  # this command's store; the data host's pgBackRest job writes store="postgresql"
_SUCCESS = "bundle_backup_last_success_timestamp_seconds"
# No HELP for the success time: the data host's pgBackRest job writes the same metric
# in a file of its own (store="postgresql"), and the node exporter takes one help text
# per metric across its files.
_HELP = {
    "bundle_backup_last_run_timestamp_seconds": "When the last backup ended, whatever its outcome (Unix time).",
    "bundle_backup_last_run_success": "1 when the last backup succeeded, else 0.",
    "bundle_backup_last_duration_seconds": "How long the last backup took.",
    "bundle_backup_last_size_bytes": "The size of the data the last successful backup held.",
}


def last_success(path: str) -> float | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    found = re.search(rf'^{_SUCCESS}{{store="{STORE}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def record(path: str, succeeded: bool, duration: float, size: int | None) -> None:
    """Rewrite the textfile at `path` with this run's outcome."""
    if not path:
        return
    now = time.time()
    success = now if succeeded else last_success(path)
    values: dict[str, float | None] = {
        _SUCCESS: success,
        "bundle_backup_last_run_timestamp_seconds": now,
        "bundle_backup_last_run_success": 1 if succeeded else 0,
        "bundle_backup_last_duration_seconds": duration,
        "bundle_backup_last_size_bytes": size,
    }
    lines = []
    for name, value in values.items():
        if value is None:
            continue
        if name in _HELP:
            lines.append(f"# HELP {name} {_HELP[name]}")
        lines += [f"# TYPE {name} gauge", f'{name}{{store="{STORE}"}} {value:.3f}']
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
