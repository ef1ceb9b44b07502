"""Putting a snapshot back: read it into a scratch folder, check all of it (every
SHA-256 of its manifest, SQLite's integrity, a schema this code knows), and only
then move the host's data aside (kept under the work folder, never deleted) and the
snapshot's into place. Every refusal comes before the first move, so a bad snapshot,
a wrong password or a snapshot of a newer release changes nothing."""

from __future__ import annotations

import grp
import importlib
import json
import os
import pwd
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app import registry
from app.backup import snapshot as snap
from app.backup.errors import BackupError
from app.backup.restic import Restic, Snapshot

# Written by `record-provisioned` at a fresh host's first provisioning: what the playbook
# itself put in the data folders, so that a restore knows a host holding only that is empty.
PROVISIONED = ".provisioned.json"
# Tables whose rows change without anyone's data changing: a running service registers
# itself there (app.common.live_processes).
VOLATILE_TABLES = frozenset({"live_processes"})


@dataclass(frozen=True)
class Checked:
    """A snapshot read back and checked: its folder in the scratch space and its manifest."""

    folder: str
    manifest: dict[str, Any]

    def parts(self) -> Iterator[tuple[str, dict[str, Any], str]]:
        """(label, manifest part, folder in the snapshot) of every copied folder."""
        for service, part in self.manifest["services"].items():
            yield service, part, os.path.join(self.folder, "services", service)
        for number, part in enumerate(self.manifest["extra"]):
            yield part["path"], part, os.path.join(self.folder, "extra", str(number))

    @property
    def files(self) -> int:
        return sum(len(part["files"]) for _, part, _ in self.parts())


def read_back(restic: Restic, chosen: Snapshot, scratch: str) -> Checked:
    """Restore `chosen` into `scratch` and check it whole."""
    restic.restore(chosen, scratch)
    if len(chosen.paths) != 1:
        raise BackupError(
            f"snapshot {chosen.short_id} is not one of this command's (it holds {len(chosen.paths)} paths)"
        )
    folder = os.path.join(scratch, chosen.paths[0].lstrip("/"))
    manifest_path = os.path.join(folder, snap.MANIFEST)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise BackupError(f"snapshot {chosen.short_id} has no manifest: it is not one of this command's") from None
    except ValueError:
        raise BackupError(f"the manifest of snapshot {chosen.short_id} is corrupt") from None
    if manifest.get("format", 0) > snap.FORMAT:
        raise BackupError(
            f"snapshot {chosen.short_id} was made by a newer release ({manifest.get('bundle_version')}) "
            "in a format this one cannot read: install that release first"
        )
    checked = Checked(folder, manifest)
    verify_files(checked, chosen.short_id)
    return checked


def verify_files(checked: Checked, label: str) -> None:
    """Every file of the manifest is there with its size and SHA-256; every SQLite copy
    passes its integrity check; no service's schema is newer than this code's."""
    for name, part, folder in checked.parts():
        for rel, entry in part["files"].items():
            path = os.path.join(folder, rel)
            if not os.path.isfile(path):
                raise BackupError(f"snapshot {label} is damaged: {name}/{rel} is missing")
            if os.path.getsize(path) != entry["size"] or snap.sha256_of(path) != entry["sha256"]:
                raise BackupError(f"snapshot {label} is damaged: {name}/{rel} does not match its SHA-256")
        for rel in part["sqlite"]:
            _check_sqlite(os.path.join(folder, rel), f"{name}/{rel}", label)
        if name in registry.NAMES:
            _check_schema(name, part, label)
    secrets = checked.manifest.get("secrets")
    if secrets:
        path = os.path.join(checked.folder, "secrets.json")
        if not os.path.isfile(path) or snap.sha256_of(path) != secrets["sha256"]:
            raise BackupError(f"snapshot {label} is damaged: its secrets file does not match its SHA-256")


def _check_sqlite(path: str, name: str, label: str) -> None:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        verdict = connection.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        verdict = str(exc)
    finally:
        connection.close()
    if verdict != "ok":
        raise BackupError(f"snapshot {label} is damaged: {name} fails SQLite's integrity check ({verdict})")


def _check_schema(service: str, part: dict[str, Any], label: str) -> None:
    """Refuse a database recording a schema step this code does not have: the snapshot
    comes from a newer release, whose data this one may misread."""
    recorded = [max(facts["schema"]) for facts in part["sqlite"].values() if facts.get("schema")]
    module = registry.BY_NAME[service].migrations
    if not recorded or module is None:
        return
    newest = importlib.import_module(module).HISTORY.newest
    if max(recorded) > newest:
        raise BackupError(
            f"snapshot {label} holds the {service} schema at step {max(recorded)}, newer than this release's "
            f"({newest}): install the release that made it, then restore"
        )


# -- a host that holds data -------------------------------------------------------------


def inventory(folder: str, service: str | None) -> dict[str, Any]:
    """What a data folder holds, as far as telling a provisioned host from a used one
    goes: its files (not SQLite's companions, derived files or restore marks) and the
    rows of each table of its SQLite databases, bar the volatile ones."""
    hooks = snap.service_hooks(service) if service else None
    skip = getattr(hooks, "SKIP", None)
    files, rows = [], {}
    for rel, entry in snap.walk(folder):
        if not entry.is_file(follow_symlinks=False) or snap.is_sqlite_companion(entry.name):
            continue
        if (skip and skip.match(rel)) or entry.name == "restored.json":
            continue
        if snap.is_sqlite(entry.path):
            rows[rel] = _row_counts(entry.path)
        else:
            files.append(rel)
    return {"files": files, "rows": rows}


def _row_counts(path: str) -> dict[str, int]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=snap.BUSY_TIMEOUT_SECONDS)
    try:
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            for table in tables
            if table not in VOLATILE_TABLES and not table.startswith("sqlite_")
        }
    finally:
        connection.close()


def record_provisioned(data_root: str, services: tuple[str, ...]) -> str:
    """Keep what provisioning left in each service's folder (once: a later call keeps the
    first record); returns what it did."""
    path = os.path.join(data_root, PROVISIONED)
    if os.path.exists(path):
        return f"kept the record of {path}"
    record = {service: inventory(os.path.join(data_root, service), service) for service in services}
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return f"recorded what provisioning left in {path}"


def data_held(data_root: str, checked: Checked) -> list[str]:
    """What this host holds beyond what its provisioning made, in the services' folders
    the snapshot would replace (for the refusal's sentence)."""
    try:
        with open(os.path.join(data_root, PROVISIONED), encoding="utf-8") as f:
            provisioned = json.load(f)
    except FileNotFoundError:
        provisioned = {}
    held: list[str] = []
    for service in checked.manifest["services"]:
        folder = os.path.join(data_root, service)
        if not os.path.isdir(folder):
            continue
        now, then = inventory(folder, service), provisioned.get(service, {"files": [], "rows": {}})
        held += [f"{service}/{rel}" for rel in now["files"] if rel not in then["files"]]
        for rel, counts in now["rows"].items():
            before = then["rows"].get(rel, {})
            held += [
                f"{service}/{rel} ({table}: {n} rows)" for table, n in counts.items() if n and n != before.get(table)
            ]
    # The extra paths are not judged: they hold backup material of the host's own (a data
    # host's pgBackRest repository, which a fresh host starts anew), and a restore puts
    # the host's copy aside, never deletes it.
    return held


# -- putting it in place ----------------------------------------------------------------


def put_in_place(checked: Checked, data_root: str, aside: str, snapshot_id: str) -> list[str]:
    """Move each folder of the host that the snapshot holds to `aside`, and the
    snapshot's in its place, with its owners and modes; returns what moved aside."""
    moved = []
    for name, part, folder in checked.parts():
        target = os.path.join(data_root, name) if name in checked.manifest["services"] else name
        if os.path.lexists(target):
            keep = os.path.join(aside, name.strip("/").replace("/", "_"))
            os.makedirs(os.path.dirname(keep), exist_ok=True)
            shutil.move(target, keep)
            moved.append(keep)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(folder, target)
        apply_owners(target, part)
        hooks = snap.service_hooks(name) if name in checked.manifest["services"] else None
        if hooks is not None and part["hooked"]:
            hooks.restored(target, part["hooked"], snapshot_id)
    return moved


def put_secrets_in_place(checked: Checked, path: str, aside: str) -> str | None:
    """Put the snapshot's secrets file at `path` (this host's BACKUP_SECRETS_FILE), the
    one there kept aside; None when either has none."""
    secrets = checked.manifest.get("secrets")
    if not secrets or not path:
        return None
    if os.path.exists(path):
        os.makedirs(aside, exist_ok=True)
        shutil.copy2(path, os.path.join(aside, "secrets.json"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = path + ".restoring"
    shutil.copyfile(os.path.join(checked.folder, "secrets.json"), temporary)
    _apply(temporary, secrets)
    os.replace(temporary, path)
    return path


def apply_owners(folder: str, part: dict[str, Any]) -> None:
    for rel, entry in part["dirs"].items():
        _apply(os.path.join(folder, rel) if rel else folder, entry)
    for rel, entry in part["files"].items():
        _apply(os.path.join(folder, rel), entry)


def _apply(path: str, entry: dict[str, Any]) -> None:
    """The recorded owner (by name where this host knows it, else by number) and mode."""
    if os.geteuid() == 0:
        uid = _number(pwd.getpwnam, entry.get("user"), entry["uid"])
        gid = _number(grp.getgrnam, entry.get("group"), entry["gid"])
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, entry["mode"])


def _number(lookup: Any, name: str | None, fallback: int) -> int:
    if name:
        try:
            return int(lookup(name)[2])
        except KeyError:
            pass
    return fallback
