"""Records a backup store's last success for the node exporter's textfile collector.

    python3 bundle_backup_status.py STORE [FILE]

Writes FILE (default: the variable BUNDLE_BACKUP_STATUS_FILE; nothing when both are
empty) atomically (a temporary file renamed over it, so the exporter never reads half
a file) with bundle_backup_last_success_timestamp_seconds{store="STORE"} set to now.
The unit of pgBackRest's backups runs it after a backup and its `verify` succeeded, so
the time stays that of the last success when a run fails (and BackupTooOld fires).
No HELP line: the file store's status file (python -m app.backup) has the same metric,
and the node exporter takes one help text per metric across its files.
Standard library only: it runs with the host's python3.
"""

import os
import re
import sys
import time


def render(store, now):
    return (
        "# TYPE bundle_backup_last_success_timestamp_seconds gauge\n"
        f'bundle_backup_last_success_timestamp_seconds{{store="{store}"}} {now:.3f}\n'
    )


def write(path, text):
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def main(argv):
    if len(argv) not in (1, 2) or not re.fullmatch(r"[a-z_]+", argv[0]):
        raise SystemExit(__doc__)
    path = argv[1] if len(argv) == 2 else os.environ.get("BUNDLE_BACKUP_STATUS_FILE", "")
    if path:
        write(path, render(argv[0], time.time()))


if __name__ == "__main__":
    main(sys.argv[1:])
