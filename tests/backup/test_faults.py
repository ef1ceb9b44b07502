"""The backup command's bad inputs and faults, each a clear one-line error that
changes nothing: a wrong password, a damaged or truncated snapshot, a full disk
(the repository's, the work folder's), two runs at once, a snapshot of a newer
schema, a restore under a running service or over a host's data. And what a
snapshot is made of: SQLite copied live and whole, a deck log to its last complete
line, no file written into a data folder, the outcome for Prometheus."""

import fcntl
import json
import os
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest
import requests

from devtools import services
from tests.support.backup import BackupHost, new_repository
from tests.support.decks import copy_sample_deck, tree


def _sqlite(path, rows=3, schema=(1,)):
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = wal")
    db.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT)")
    db.executemany("INSERT INTO things (name) VALUES (?)", [(f"thing {n}",) for n in range(rows)])
    db.execute("CREATE TABLE schema_migrations (version INTEGER, name TEXT, applied_at TEXT, phase TEXT)")
    db.executemany("INSERT INTO schema_migrations VALUES (?, 'step', '', 'expand')", [(v,) for v in schema])
    db.commit()
    db.close()


def _log(path, events, torn=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = b"".join(json.dumps({"seq": n, "ts": "t", "type": "note"}).encode() + b"\n" for n in range(1, events + 1))
    path.write_bytes(lines + torn)


@pytest.fixture
def host(tmp_path):
    """A host's data (a wizard database and upload, a deck session's log) and its
    backup settings on a fresh repository."""
    repository, password = new_repository(tmp_path / "offsite")
    root = tmp_path / "var"
    _sqlite(root / "wizard/wizard.db")
    (root / "wizard/uploads").mkdir()
    (root / "wizard/uploads/picture.png").write_bytes(os.urandom(2048))
    _log(root / "decks/sessions/s1/events.jsonl", 5)
    secrets = tmp_path / "etc/secrets.json"
    secrets.parent.mkdir()
    secrets.write_text('{"notebook_encryption_key": "k"}')
    return BackupHost(root, repository, password, secrets, status_file=tmp_path / "backup.prom")


def _snapshots(host):
    return host.ok("list").splitlines()


def test_a_snapshot_holds_sqlite_whole_and_a_log_to_its_last_line_and_writes_nothing_in_a_data_folder(host, tmp_path):
    _log(host.data_root / "decks/sessions/s1/events.jsonl", 7, torn=b'{"seq": 8, "ts": "t", "ty')
    (host.data_root / "decks/sessions/s1/events.idx").write_bytes(b"derived")
    before = tree(host.data_root)
    created = host.ok("create")
    assert created.startswith("created snapshot ") and "3 files" in created, created
    assert tree(host.data_root) == before  # not a byte, not a lock file, not an mtime
    status = (tmp_path / "backup.prom").read_text()
    assert 'bundle_backup_last_run_success{store="files"} 1.000' in status
    assert 'bundle_backup_last_success_timestamp_seconds{store="files"}' in status
    verified = host.ok("verify")
    assert "3 files match their SHA-256" in verified, verified

    other = BackupHost(tmp_path / "elsewhere", host.repository, host.password_file, tmp_path / "etc2/secrets.json")
    other.ok("restore", "latest", "--host", "bundle-test")
    log = (other.data_root / "decks/sessions/s1/events.jsonl").read_bytes()
    assert log == (host.data_root / "decks/sessions/s1/events.jsonl").read_bytes().rsplit(b"\n", 1)[0] + b"\n"
    assert not (other.data_root / "decks/sessions/s1/events.idx").exists()
    mark = json.loads((other.data_root / "decks/sessions/s1/restored.json").read_text())
    assert mark["highest_seq"] == 7 and mark["bytes"] == len(log)
    db = sqlite3.connect(other.data_root / "wizard/wizard.db")
    assert db.execute("SELECT count(*) FROM things").fetchone() == (3,)
    assert (tmp_path / "etc2/secrets.json").read_text() == host.secrets_file.read_text()
    assert (other.data_root / "wizard/uploads/picture.png").read_bytes() == (
        host.data_root / "wizard/uploads/picture.png"
    ).read_bytes()


def test_a_live_sqlite_copy_has_what_was_committed_and_holds_no_writer(host):
    """A writer holds an open transaction and a commit still only in the WAL while the
    copy runs: the copy has the commit, not the open transaction, and the writer commits."""
    path = host.data_root / "wizard/wizard.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("INSERT INTO things (name) VALUES ('committed')")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO things (name) VALUES ('open')")
    try:
        host.ok("create")
    finally:
        writer.execute("COMMIT")
        writer.close()
    other = BackupHost(host.data_root.parent / "copy", host.repository, host.password_file)
    other.ok("restore", "latest", "--host", "bundle-test")
    names = {row[0] for row in sqlite3.connect(other.data_root / "wizard/wizard.db").execute("SELECT name FROM things")}
    assert "committed" in names and "open" not in names


def test_a_wrong_password_is_one_line_and_changes_nothing(host, tmp_path):
    host.ok("create")
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    bad = BackupHost(host.data_root, host.repository, wrong, host.secrets_file, status_file=host.status_file)
    before = tree(host.data_root)
    for command in (["list"], ["create"], ["verify"], ["restore", "latest", "--replace"]):
        assert bad.refused(*command).endswith("the repository's password is wrong (BACKUP_PASSWORD_FILE)")
    assert tree(host.data_root) == before and len(_snapshots(host)) == 1
    status = host.status_file.read_text()
    assert 'bundle_backup_last_run_success{store="files"} 0.000' in status
    assert 'bundle_backup_last_success_timestamp_seconds{store="files"}' in status  # kept from the success


# A byte flipped in every pack of data (a disk's rot), or the snapshot's own file cut
# short (a copy that stopped). (A pack cut short fails too, after restic's retries: a
# minute and a half, too long for the suite.)
@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_snapshot_is_refused_and_nothing_is_overwritten(host, damage):
    host.ok("create")
    if damage == "flipped":
        for pack in (p for p in (host.repository / "data").rglob("*") if p.is_file()):
            data = bytearray(pack.read_bytes())
            data[len(data) // 2] ^= 0xFF
            pack.write_bytes(bytes(data))
    else:
        for snapshot in (host.repository / "snapshots").iterdir():
            snapshot.write_bytes(snapshot.read_bytes()[:100])
    _log(host.data_root / "decks/sessions/s1/events.jsonl", 9)  # what the host holds now
    before = tree(host.data_root)
    assert host.refused("verify").startswith("error: ")
    line = host.refused("restore", "latest", "--replace")
    assert "failed" in line or "damaged" in line, line
    if damage == "truncated":
        assert line.startswith("error: snapshot ") and "is damaged (restic cannot read it)" in line, line
        assert host.ok("list").endswith("damaged: restic cannot read it\n")
    assert tree(host.data_root) == before
    assert not list(Path(host.environment()["BACKUP_WORK_DIR"]).glob("replaced-*"))


def _tmpfs(path, size):
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.decode().strip()}")
    return path


def test_a_full_repository_disk_fails_the_backup_and_keeps_the_earlier_snapshots(tmp_path):
    disk = _tmpfs(tmp_path / "small-disk", "3m")
    try:
        repository, password = new_repository(disk)
        root = tmp_path / "var"
        _sqlite(root / "wizard/wizard.db")
        host = BackupHost(root, repository, password, status_file=tmp_path / "status.prom")
        host.ok("create")
        (root / "wizard/uploads").mkdir()
        (root / "wizard/uploads/big.bin").write_bytes(os.urandom(4 * 1024 * 1024))  # incompressible
        assert (
            host.refused("create")
            == "error: storing the snapshot failed: the repository's disk is full: nothing was stored"
        )
        assert len(_snapshots(host)) == 1
        (root / "wizard/uploads/big.bin").unlink()
        host.ok("verify")
        assert 'bundle_backup_last_run_success{store="files"} 0.000' in (tmp_path / "status.prom").read_text()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_work_disk_fails_the_copy_and_leaves_nothing_behind(host, tmp_path):
    work = _tmpfs(tmp_path / "small-work", "1m")
    try:
        (host.data_root / "wizard/uploads/big.bin").write_bytes(os.urandom(2 * 1024 * 1024))
        host.extra["BACKUP_WORK_DIR"] = str(work)
        line = host.refused("create")
        assert line.startswith("error: copying the data failed: No space left on device"), line
        assert not (work / "stage").exists()
        host.extra["BACKUP_WORK_DIR"] = str(tmp_path / "work")
        assert _snapshots(host) == ["no snapshot"]
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)


def test_two_runs_at_once_the_second_refuses(host):
    host.ok("create")
    status = host.status_file.read_text()
    work = Path(host.environment()["BACKUP_WORK_DIR"])
    with open(work / "lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.truncate(0)
        lock.write("4242\n")
        lock.flush()
        for command in (["create"], ["restore", "latest", "--replace"]):
            line = host.refused(*command)
            assert line == "error: another backup or restore is running on this host (pid 4242): nothing was done", line
    assert len(_snapshots(host)) == 1
    assert host.status_file.read_text() == status  # the running one will say how it went
    host.ok("create")


def test_a_snapshot_of_a_newer_schema_is_refused(host):
    (host.data_root / "wizard/wizard.db").unlink()
    _sqlite(host.data_root / "wizard/wizard.db", schema=(1, 2, 999))
    host.ok("create")
    _sqlite(host.data_root.parent / "scratch.db")
    before = tree(host.data_root)
    line = host.refused("restore", "latest", "--replace")
    assert "holds the wizard schema at step 999, newer than this release's" in line, line
    assert tree(host.data_root) == before


def test_a_restore_over_data_needs_replace_and_keeps_what_it_replaced(host):
    host.ok("create")
    _log(host.data_root / "decks/sessions/s1/events.jsonl", 9)
    (host.data_root / "decks/sessions/s2").mkdir()
    line = host.refused("restore", "latest")
    assert line.startswith("error: this host holds data (decks/sessions/s1/events.jsonl"), line
    done = host.ok("restore", "latest", "--replace")
    kept = Path(done.rsplit("kept in ", 1)[1].strip())
    assert len((kept / "decks/sessions/s1/events.jsonl").read_bytes().splitlines()) == 9
    assert (kept / "secrets.json").exists()
    assert len((host.data_root / "decks/sessions/s1/events.jsonl").read_bytes().splitlines()) == 5


def test_a_provisioned_host_restores_without_replace(host, tmp_path):
    """What the playbook recorded at provisioning does not count as the host's data."""
    host.ok("create")
    fresh = BackupHost(tmp_path / "fresh", host.repository, host.password_file)
    _sqlite(fresh.data_root / "wizard/wizard.db", rows=1)  # provisioning's own rows
    assert fresh.ok("record-provisioned").startswith("recorded what provisioning left")
    assert fresh.ok("record-provisioned").startswith("kept the record")
    fresh.ok("restore", "latest", "--host", "bundle-test")
    db = sqlite3.connect(fresh.data_root / "wizard/wizard.db")
    assert db.execute("SELECT count(*) FROM things").fetchone() == (3,)


def test_a_restore_under_a_running_service_is_refused(host, tmp_path):
    data = host.data_root / "decks"
    body = copy_sample_deck(data)
    service = services.start("decks", data)
    try:
        requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=30).raise_for_status()
        host.ok("create")  # online: the service goes on
        line = host.refused("restore", "latest", "--replace")
        assert line.startswith("error: a process uses the decks data folder (pid "), line
        assert "systemctl stop bundle@decks.socket" in line
    finally:
        service.stop()
    host.ok("restore", "latest", "--replace")


def test_unknown_snapshots_and_settings_are_clear_errors(host):
    host.ok("create")
    assert host.refused("restore", "0123abcd") == "error: no such snapshot: 0123abcd"
    assert host.refused("restore", "../etc") == "error: '../etc' is not a snapshot id (see `list`) nor `latest`"
    assert host.refused("verify", "latest", "--host", "elsewhere").startswith(
        "error: the repository holds no snapshot of host 'elsewhere'"
    )
    missing = BackupHost(host.data_root, host.repository, host.password_file, extra={"BACKUP_SERVICES": "nope"})
    done = missing.run("create")
    assert done.returncode == 2 and done.stderr.startswith("error: BACKUP_SERVICES: unknown service 'nope'")
    nowhere = BackupHost(host.data_root, host.data_root.parent / f"none-{uuid.uuid4().hex}", host.password_file)
    assert "there is no restic repository at BACKUP_REPOSITORY" in nowhere.refused("list")
