"""What the backup command (app.backup) needs to know of the deck service's files
beyond a plain copy: the hooks `SKIP`, `copy_special` and `restored`.

- A session's event log is append-only and fsynced line by line: its copy is the
  log up to its last complete line at one moment (a line being written is left for
  the next backup), with its highest seq and byte length kept in the manifest.
- Its sparse index (events.idx) is derived: left out, and rebuilt from the log.
- After a restore each log gets the mark app.decks.eventlog reads (`seq_floor`), so
  the session never hands out again a seq that a client may hold from after the
  backup."""

import os
import re

from app.decks.eventlog import RESTORED_MARK, mark_restored, scan_tail

SKIP = re.compile(r"^sessions/[^/]+/events\.idx$")
_LOG = re.compile(r"^sessions/([^/]+)/events\.jsonl$")
_BLOCK = 1024 * 1024


def copy_special(rel: str, source: str, target: str) -> dict | None:
    """Copy `rel` when it is an event log and return its facts; None for any other file."""
    if not _LOG.match(rel):
        return None
    fd = os.open(source, os.O_RDONLY)
    try:
        highest, length = scan_tail(fd, os.fstat(fd).st_size)
        with open(target, "wb") as out:
            offset = 0
            while offset < length:
                chunk = os.pread(fd, min(_BLOCK, length - offset), offset)
                if not chunk:
                    break
                out.write(chunk)
                offset += len(chunk)
            out.flush()
            os.fsync(out.fileno())
    finally:
        os.close(fd)
    return {"highest_seq": highest, "bytes": length}


def restored(data_dir: str, hooked: dict, snapshot: str) -> None:
    """Mark every restored log with what it held at its backup (`hooked`: the manifest's
    facts of each log, by its path below the data folder)."""
    for rel, facts in hooked.items():
        if not _LOG.match(rel):
            continue
        path = os.path.join(data_dir, rel)
        mark_restored(path, facts["highest_seq"], facts["bytes"], snapshot)
        folder = os.stat(os.path.dirname(path))
        if os.geteuid() == 0:
            os.chown(os.path.join(os.path.dirname(path), RESTORED_MARK), folder.st_uid, folder.st_gid)
