"""The restore drill on one host's five services, as real gunicorn processes on
SQLite and files: writes on every service (the load loop, counted as acknowledged),
a backup taken while they go on, more writes, the host's data folders and secrets
destroyed, a fresh host restored from the repository. Every write acknowledged before
the backup started is there, the deck session's next seq passes every seq handed out
after the backup, tokens still sign in, the notebook's stored key still decrypts.
(The same drill on staging boxes through nginx, with the playbook's units and timer:
tests/ops/test_staging.py and, on PostgreSQL, tests/ops/test_two_hosts.py.)"""

import hashlib
import shutil
import time

import pytest
import requests

from devtools.fake_providers import FakeProviders
from devtools.load_loop import LoadLoop
from devtools.waiting import wait_for
from tests.support.backup import BackupHost, FiveServices, fresh_secrets, new_repository, seed_sound_library
from tests.support.decks import data_url, png_bytes


@pytest.fixture
def ai():
    with FakeProviders(host="127.0.0.1") as fake:
        yield fake


def _open_client(host):
    def open_client(name):
        http = requests.Session()
        if name == "wizard":  # as its forward auth would say (the test identity, on loopback)
            http.headers["X-Wiz-Test-User"] = "alice"
        return http, host.base_url(name)

    return open_client


def _credentials(host):
    secrets = host.secrets()
    return {**secrets, "workspace_owner_email": "admin@backup.test"}


def _files_before_the_backup(host, loop):
    """What the load loop does not write: a scribble, a notebook upload and its stored
    key, a wizard upload. Returns how to find each again, with its bytes."""
    decks = next(w for w in loop.workloads if w.service == "decks")
    scribble = png_bytes(5, 4)
    made = requests.post(
        f"{host.base_url('decks')}/api/sessions/{decks.session}/scribble",
        json={"image": data_url(scribble), "slide": 0},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    notebook = requests.Session()
    notebook.headers["Authorization"] = f"Bearer {host.secrets()['notebook_password']}"
    nb = host.base_url("notebook")
    book = notebook.post(nb + "/api/notebooks", json={"name": "drill", "description": ""}, timeout=30).json()["id"]
    text = b"Estuaries mix fresh and salt water.\n" * 50
    source = notebook.post(
        nb + "/api/sources",
        data={"type": "upload", "notebook_id": book, "embed": "false"},
        files={"file": ("estuaries.txt", text)},
        timeout=60,
    )
    assert source.status_code == 201, source.text
    key = notebook.post(
        nb + "/api/credentials", json={"name": "drill", "provider": "openai", "api_key": "sk-drill-1234"}, timeout=30
    )
    assert key.status_code == 201, key.text
    image = requests.post(
        host.base_url("wizard") + "/api/uploads",
        files={"file": ("a.png", png_bytes(3, 3))},
        headers={"X-Wiz-Test-User": "bob"},
        timeout=30,
    )
    assert image.status_code == 201, image.text
    return {
        "scribble": (f"/api/sessions/{decks.session}/scribbles/{made.json()['file']}", scribble),
        "upload": (f"/api/sources/{source.json()['id']}/download", text),
        "credential": f"/api/credentials/{key.json()['id']}",
        "image": (image.json()["url"], png_bytes(3, 3)),
    }


def test_a_backup_under_writes_restores_every_write_acknowledged_before_it(tmp_path, ai):
    repository, password = new_repository(tmp_path / "offsite")
    old = FiveServices(tmp_path / "old/var", tmp_path / "old/etc/secrets.json", ai)
    fresh_secrets(old.secrets_file)
    seed_sound_library(old.data_root)
    old.start()
    old.provision()
    old_backup = BackupHost(old.data_root, repository, password, old.secrets_file, status_file=tmp_path / "old.prom")
    loop = LoadLoop(_open_client(old), _credentials(old))
    try:
        with loop.running():
            files = _files_before_the_backup(old, loop)
            backup_started = time.monotonic()
            created = old_backup.ok("create")
            counts = {name: len(t.acknowledged) for name, t in loop.tallies.items()}
            try:
                wait_for(
                    lambda: all(
                        len(loop.tallies[n].acknowledged) >= counts[n] + 3 for n in ("decks", "wizard", "notebook")
                    ),
                    "more writes after the backup",
                )
            except TimeoutError:
                pytest.fail(loop.summary())
        loop.streams_stop.set()  # the held streams are not checked here
        assert loop.failures() == {}, loop.summary()
        before = loop.acknowledged_before(backup_started)
        assert all(before[name] for name in ("decks", "wizard", "notebook", "workspace")), before
        print(f"\n{created.strip()}\n{loop.summary()}")
        highest_seq = max(loop.tallies["decks"].acknowledged)
        status = (tmp_path / "old.prom").read_text()
        assert 'bundle_backup_last_run_success{store="files"} 1' in status, status
    finally:
        old.stop()
    assert old_backup.refused("restore", "latest").startswith("error: this host holds data (")
    sounds = _digests(old.data_root / "audio/soundlib")

    # The host is lost: a new one, provisioned (new secrets), restored from the repository.
    shutil.rmtree(tmp_path / "old")
    new = FiveServices(tmp_path / "new/var", tmp_path / "new/etc/secrets.json", ai, ports=old.ports)
    fresh_secrets(new.secrets_file)
    new_backup = BackupHost(new.data_root, repository, password, new.secrets_file)
    restored = new_backup.ok("restore", "latest")
    assert "the secrets file" in restored, restored
    new.start()
    try:
        for workload in loop.workloads:
            workload.http.headers.update(workload.headers(_credentials(new)))
        assert loop.missing_writes(among=before) == {}
        # A client may hold seqs handed out after the backup: the session never hands them out again.
        session = next(w for w in loop.workloads if w.service == "decks").session
        after = requests.post(
            f"{new.base_url('decks')}/api/sessions/{session}/events",
            json={"type": "note", "slide": 0, "text": "after the restore"},
            timeout=30,
        )
        assert after.status_code == 201 and after.json()["seq"] > highest_seq, (after.text, highest_seq)
        for name, base in (("scribble", "decks"), ("image", "wizard")):
            path, data = files[name]
            assert requests.get(new.base_url(base) + path, timeout=30).content == data
        notebook = requests.Session()
        notebook.headers["Authorization"] = f"Bearer {new.secrets()['notebook_password']}"
        path, data = files["upload"]
        assert notebook.get(new.base_url("notebook") + path, timeout=30).content == data
        credential = notebook.get(new.base_url("notebook") + files["credential"], timeout=30).json()
        assert credential["has_api_key"] and credential["decryption_error"] is None, credential
        assert sounds and _digests(new.data_root / "audio/soundlib") == sounds
    finally:
        new.stop()


def _digests(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }
