"""The backup command's sub-commands: what each does, in order, and what it prints.
One run at a time per host (a lock in the work folder): a second `create` or a
`restore` started meanwhile refuses at once."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from app.backup import restore as restoring
from app.backup import snapshot as snap
from app.backup import status
from app.backup.errors import BackupError
from app.backup.processes import users_of
from app.backup.restic import Restic
from app.backup.settings import BackupSettings
from app.common.config import RELEASE
from app.common.timeutil import utc_timestamp


def restic_of(settings: BackupSettings) -> Restic:
    settings.require_repository()
    return Restic(settings.restic, settings.repository, settings.password_file, settings.cache_dir)


@contextmanager
def one_at_a_time(settings: BackupSettings) -> Iterator[None]:
    os.makedirs(settings.work_dir, mode=0o700, exist_ok=True)
    with open(os.path.join(settings.work_dir, "lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise BackupError(
                f"another backup or restore is running on this host (pid {holder}): nothing was done"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


def init(settings: BackupSettings, out: TextIO) -> None:
    restic = restic_of(settings)
    if restic.initialized():
        out.write(f"the repository at {settings.repository} exists\n")
        return
    restic.init()
    out.write(f"made the repository at {settings.repository}\n")


def create(settings: BackupSettings, out: TextIO) -> None:
    """Stage, store, then forget what the retention lets go. The status file records
    whether a snapshot was stored (a run refused by the lock records nothing; a failed
    prune after a stored snapshot is an error, not a failed backup)."""
    restic = restic_of(settings)
    with one_at_a_time(settings):
        started = time.monotonic()
        stored = None
        try:
            stored = _store(settings, restic)
        finally:
            status.record(settings.status_file, stored is not None, time.monotonic() - started, stored and stored[1])
        summary, size, files = stored
        out.write(
            f"created snapshot {summary['snapshot_id'][:8]} of {settings.host_name}: {files} files, {size} bytes "
            f"({summary.get('data_added', 0)} new in the repository) in {time.monotonic() - started:.1f} s\n"
        )
        restic.forget(
            settings.host_name, settings.keep_last, settings.keep_daily, settings.keep_weekly, settings.keep_monthly
        )


def _store(settings: BackupSettings, restic: Restic) -> tuple[dict, int, int]:
    """(restic's summary, bytes, files) of a new snapshot of this host's data."""
    stage_root = os.path.join(settings.work_dir, "stage")
    shutil.rmtree(stage_root, ignore_errors=True)  # what a killed run left
    folder = os.path.join(stage_root, "snapshot")
    try:
        manifest = snap.stage(settings, folder, RELEASE)
        summary = restic.backup(folder, settings.host_name, [])
    except OSError as exc:
        raise BackupError(f"copying the data failed: {exc.strerror or exc} ({exc.filename or ''})") from None
    finally:
        shutil.rmtree(stage_root, ignore_errors=True)
    files = sum(len(p["files"]) for p in [*manifest["services"].values(), *manifest["extra"]])
    return summary, snap.total_size(manifest), files


def list_snapshots(settings: BackupSettings, out: TextIO, host: str | None) -> None:
    found, damaged = restic_of(settings).snapshots(host)
    if not found and not damaged:
        out.write("no snapshot\n")
    for entry in found:
        out.write(f"{entry.short_id}  {entry.time[:19]}Z  {entry.host}\n")
    for short_id in damaged:
        out.write(f"{short_id}  damaged: restic cannot read it\n")


def verify(settings: BackupSettings, out: TextIO, chosen: str, host: str | None) -> None:
    restic = restic_of(settings)
    with one_at_a_time(settings):
        restic.check()
        snapshot = restic.find(chosen, host or settings.host_name)
        scratch = os.path.join(settings.work_dir, f"verify-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            checked = restoring.read_back(restic, snapshot, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    out.write(
        f"snapshot {snapshot.short_id} of {snapshot.host} ({snapshot.time[:19]}Z) is whole: the repository checks, "
        f"{checked.files} files match their SHA-256, every SQLite copy passes its integrity check\n"
    )


def restore(settings: BackupSettings, out: TextIO, chosen: str, host: str | None, replace: bool) -> None:
    restic = restic_of(settings)
    with one_at_a_time(settings):
        snapshot = restic.find(chosen, host or settings.host_name)
        stamp = utc_timestamp().replace(":", "")
        scratch = os.path.join(settings.work_dir, f"restore-{stamp}")
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            checked = restoring.read_back(restic, snapshot, scratch)
            _refuse_while_served(settings, checked)
            held = restoring.data_held(settings.data_root, checked)
            if held and not replace:
                more = f" and {len(held) - 3} more" if len(held) > 3 else ""
                raise BackupError(
                    f"this host holds data ({', '.join(held[:3])}{more}): nothing was restored; "
                    "`restore --replace` puts it aside (kept in the work folder) and restores"
                )
            aside = os.path.join(settings.work_dir, f"replaced-{stamp}")
            moved = restoring.put_in_place(checked, settings.data_root, aside, snapshot.id)
            secrets = restoring.put_secrets_in_place(checked, settings.secrets_file, aside)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    kept = f"; what it replaced is kept in {aside}" if moved or secrets else ""
    names = ", ".join([*checked.manifest["services"], *(p["path"] for p in checked.manifest["extra"])])
    out.write(
        f"restored snapshot {snapshot.short_id} of {snapshot.host} ({checked.manifest['created']}, release "
        f"{checked.manifest['bundle_version']}): {names}{', the secrets file' if secrets else ''}{kept}\n"
    )


def _refuse_while_served(settings: BackupSettings, checked: restoring.Checked) -> None:
    for name in checked.manifest["services"]:
        users = users_of(settings.data_dir(name))
        if users:
            raise BackupError(
                f"a process uses the {name} data folder (pid {users[0]}): stop the service first "
                f"(systemctl stop bundle@{name}.socket), or leave the folder; nothing was restored"
            )


def record_provisioned(settings: BackupSettings, out: TextIO) -> None:
    out.write(restoring.record_provisioned(settings.data_root, settings.services) + "\n")
