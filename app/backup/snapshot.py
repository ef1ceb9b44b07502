"""What a snapshot holds, made online into a staging folder (never into a data folder):

    <stage>/manifest.json         what follows, with the SHA-256, size, mode and owner of every file
    <stage>/services/<service>/   each service's DATA_DIR, as it was at one moment:
        - each SQLite database (found by its header, whatever its name) copied with
          `VACUUM INTO`: one consistent file, as of the copy's start, taken without
          blocking the service's writers (a reader of a WAL database blocks none), then
          fsynced and checked with `PRAGMA integrity_check`; its -wal, -shm and
          -journal files are left out (the copy holds what they held, committed). A
          database nobody has open is copied byte for byte instead (it is whole in its
          file), so that no reader's -wal or -shm is left in the data folder;
        - what a service's own hooks copy (app/<service>/backup.py: the deck
          service's event logs up to their last complete line, with their highest seq
          and length; its derived indexes left out);
        - every other file as it is (uploads, scribbles, assets, podcasts, sounds).
    <stage>/extra/<n>/            each folder of BACKUP_EXTRA_PATHS, as plain files
    <stage>/secrets.json          the host's secrets file (restic encrypts the repository)

The files are copied and hashed one at a time, so a writer is never held for more
than one SQLite page read; a file that disappears meanwhile is left out (it was
being replaced, or deleted by its service)."""

from __future__ import annotations

import grp
import hashlib
import importlib
import importlib.util
import json
import os
import pwd
import shutil
import sqlite3
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from app.backup.errors import BackupError
from app.common.fsutil import fsync_dir
from app.common.timeutil import utc_timestamp

FORMAT = 1  # of the manifest; a restore refuses a newer one
MANIFEST = "manifest.json"
SQLITE_HEADER = b"SQLite format 3\x00"
# SQLite's companions of a database file: what they hold is in the copy of the database.
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")
BUSY_TIMEOUT_SECONDS = 30.0  # a copy waits this long for a lock (only a checkpoint can hold it)
_CHUNK = 1024 * 1024


@dataclass
class Tree:
    """One folder's part of the manifest: its files and folders, and what the copy
    learned of the special ones (SQLite databases, a service's hooked files)."""

    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    dirs: dict[str, dict[str, Any]] = field(default_factory=dict)
    sqlite: dict[str, dict[str, Any]] = field(default_factory=dict)
    hooked: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"files": self.files, "dirs": self.dirs, "sqlite": self.sqlite, "hooked": self.hooked}

    @property
    def size(self) -> int:
        return sum(entry["size"] for entry in self.files.values())


def service_hooks(service: str) -> ModuleType | None:
    """The service's `app/<service>/backup.py`, for the files that need more than a
    copy (`SKIP`, `copy_special`, `restored`); None when it has none. Imported only
    here, so a host without the services' venv (a data host) never imports one."""
    name = f"app.{service}.backup"
    if importlib.util.find_spec(f"app.{service}") is None or importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def is_sqlite(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def is_sqlite_companion(name: str) -> bool:
    return name.endswith(SQLITE_COMPANIONS)


def owner_of(st: os.stat_result) -> dict[str, Any]:
    """Mode and owner of a file, the owner by name too: a new host's `bundle` user may
    have another number."""
    return {
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "user": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
    }


def _name(lookup: Callable[[int], Any], number: int) -> str | None:
    try:
        return str(lookup(number)[0])
    except KeyError:
        return None


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def walk(root: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(path relative to `root`, entry) of every file and folder below `root`, folders
    before what they hold, in name order; symbolic links are not followed."""
    stack = [""]
    while stack:
        relative = stack.pop()
        try:
            with os.scandir(os.path.join(root, relative)) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        folders = []
        for entry in listed:
            rel = f"{relative}/{entry.name}" if relative else entry.name
            yield rel, entry
            if entry.is_dir(follow_symlinks=False):
                folders.append(rel)
        stack.extend(reversed(folders))


def copy_sqlite(source: str, target: str) -> dict[str, Any]:
    """A consistent copy of the live database `source` at `target`, fsynced and checked;
    returns the schema versions it records (empty when it keeps no history)."""
    try:
        if not _copy_idle(source, target):
            _copy_live(source, target)
    except sqlite3.Error as exc:
        raise BackupError(f"could not copy the SQLite database {source}: {exc}") from None
    _fsync_file(target)
    check = sqlite3.connect(target, isolation_level=None)
    try:
        verdict = check.execute("PRAGMA integrity_check").fetchone()[0]
        schema = schema_versions(check)
    finally:
        check.close()
    if verdict != "ok":
        raise BackupError(f"the copy of {source} fails SQLite's integrity check: {verdict}")
    return {"schema": schema}


def _copy_idle(source: str, target: str) -> bool:
    """A database nobody has open (no -wal, no -shm: its last user removed them, after
    checkpointing everything into the file) is copied byte for byte, with no SQLite
    connection: a reader would make its -wal and -shm files in the data folder. The copy
    holds if nothing touched the file meanwhile (a writer first makes the -wal); else
    False, and the live copy takes over."""
    if any(os.path.exists(source + suffix) for suffix in ("-wal", "-shm")):
        return False
    before = os.stat(source)
    shutil.copyfile(source, target)
    after = os.stat(source)
    untouched = (before.st_ino, before.st_size, before.st_mtime_ns) == (after.st_ino, after.st_size, after.st_mtime_ns)
    if untouched and not any(os.path.exists(source + suffix) for suffix in ("-wal", "-shm")):
        return True
    os.unlink(target)
    return False


def _copy_live(source: str, target: str) -> None:
    """`VACUUM INTO` from a read-only connection: a reader of a WAL database blocks no
    writer, and sees the database as of its start."""
    companions = {suffix: os.path.exists(source + suffix) for suffix in ("-wal", "-shm")}
    try:
        reader = sqlite3.connect(
            f"file:{_uri_path(source)}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None
        )
        try:
            reader.execute("VACUUM INTO ?", (target,))
        finally:
            reader.close()
    finally:
        _give_back_companions(source, companions)


def _uri_path(path: str) -> str:
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _give_back_companions(source: str, existed: dict[str, bool]) -> None:
    """A reader of a WAL database makes its -wal and -shm files when they are missing.
    Made by root, they would keep the service (its own user) from opening its database:
    give them to the database's owner."""
    if os.geteuid() != 0:
        return
    try:
        owner = os.stat(source)
    except FileNotFoundError:
        return
    for suffix, was_there in existed.items():
        path = source + suffix
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if not was_there or st.st_uid != owner.st_uid:
            os.chown(path, owner.st_uid, owner.st_gid)


def schema_versions(connection: sqlite3.Connection) -> list[int]:
    """The schema steps a database records (app.common.migrations' two tables)."""
    versions: set[int] = set()
    for table in ("schema_migrations", "schema_expansions"):
        found = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        if found:
            versions.update(row[0] for row in connection.execute(f"SELECT version FROM {table}"))
    return sorted(versions)


def copy_tree(source: str, target: str, hooks: ModuleType | None = None) -> Tree:
    """Copy the folder `source` to `target` (which must not exist) as the module's
    docstring says; returns its part of the manifest."""
    tree = Tree()
    if not os.path.isdir(source):
        raise BackupError(f"{source} is not a folder")
    os.makedirs(target)
    tree.dirs[""] = owner_of(os.stat(source))
    skip = getattr(hooks, "SKIP", None)
    for rel, entry in walk(source):
        src, dst = entry.path, os.path.join(target, rel)
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(dst, exist_ok=True)
            tree.dirs[rel] = owner_of(st)
            continue
        if not stat.S_ISREG(st.st_mode) or is_sqlite_companion(entry.name) or (skip and skip.match(rel)):
            continue  # sockets, links, SQLite's companions, derived files
        try:
            if hooks is not None and (facts := hooks.copy_special(rel, src, dst)) is not None:
                tree.hooked[rel] = facts
            elif is_sqlite(src):
                tree.sqlite[rel] = copy_sqlite(src, dst)
            else:
                shutil.copyfile(src, dst)
                _fsync_file(dst)
        except FileNotFoundError:
            if os.path.exists(dst):
                os.unlink(dst)
            continue  # deleted or replaced by its service while we looked
        tree.files[rel] = {"sha256": sha256_of(dst), "size": os.path.getsize(dst), **owner_of(st)}
    for rel in sorted(tree.dirs, key=len, reverse=True):
        fsync_dir(os.path.join(target, rel) if rel else target)
    return tree


def stage(settings: Any, stage_dir: str, version: str) -> dict[str, Any]:
    """Copy everything a snapshot holds into `stage_dir` (made here) and write its
    manifest; returns the manifest."""
    os.makedirs(stage_dir)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "bundle_version": version,
        "created": utc_timestamp("milliseconds"),
        "host": settings.host_name,
        "data_root": settings.data_root,
        "services": {},
        "extra": [],
        "secrets": None,
    }
    for service in settings.services:
        source = settings.data_dir(service)
        if not os.path.isdir(source):
            raise BackupError(f"the {service} service has no data folder at {source}: check BACKUP_DATA_ROOT")
        tree = copy_tree(source, os.path.join(stage_dir, "services", service), service_hooks(service))
        manifest["services"][service] = tree.as_json()
    for number, path in enumerate(settings.extra_paths):
        tree = copy_tree(path, os.path.join(stage_dir, "extra", str(number)))
        manifest["extra"].append({"path": path, **tree.as_json()})
    if settings.secrets_file:
        target = os.path.join(stage_dir, "secrets.json")
        try:
            shutil.copyfile(settings.secrets_file, target)
        except FileNotFoundError:
            raise BackupError(f"no secrets file at {settings.secrets_file}: check BACKUP_SECRETS_FILE") from None
        os.chmod(target, 0o600)
        _fsync_file(target)
        st = os.stat(settings.secrets_file)
        manifest["secrets"] = {"path": settings.secrets_file, "sha256": sha256_of(target), **owner_of(st)}
    write_manifest(stage_dir, manifest)
    return manifest


def write_manifest(folder: str, manifest: dict[str, Any]) -> None:
    path = os.path.join(folder, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(folder)


def total_size(manifest: dict[str, Any]) -> int:
    parts = list(manifest["services"].values()) + list(manifest["extra"])
    return sum(entry["size"] for part in parts for entry in part["files"].values())
