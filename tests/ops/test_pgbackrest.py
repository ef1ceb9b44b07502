"""PostgreSQL's backups on the data host (the data role): its pgbackrest.conf and WAL
archiving settings rendered and run by a real PostgreSQL archiving into a real pgBackRest
repository (Debian's pgbackrest, in a temporary folder): stanza-create, a full backup,
`verify`; then point-in-time recovery by the role's restore script (bundle_pg_restore.py,
what /usr/local/sbin/bundle-pg-restore runs, here with pg_ctl instead of systemctl) to a
moment between two acknowledged writes, and to the end of the archived WAL. The HA
tier's backup (bundle_pg_backup.sh, with the rendered HA configuration) copies from a
streaming standby through that member's pgBackRest server, on certificates made by the
base and data roles' scripts, and from the primary when no standby answers. The units and
the timers are checked by tests/ops/test_static.py; the HA tier on hosts by
tests/ops/test_data_ha.py."""

import contextlib
import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from devtools.pg_server import SERVER_USER, PostgresServer
from devtools.services import free_port
from devtools.waiting import wait_for
from tests.support.ops import ansible_like, group_vars

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "ops/roles/data"
RESTORE = DATA / "files/bundle_pg_restore.py"
BACKUP = DATA / "files/bundle_pg_backup.sh"
ISSUE_CERTIFICATE = DATA / "files/bundle_pgbackrest_tls.py"
SECRETS = ROOT / "ops/roles/base/files/bundle_secrets.py"
STATUS = DATA / "files/bundle_backup_status.py"
DEFAULTS = yaml.safe_load((DATA / "defaults/main.yml").read_text())
STANZA = DEFAULTS["data_pgbackrest_stanza"]

pytestmark = pytest.mark.skipif(
    shutil.which("pgbackrest") is None, reason="pgbackrest is missing: run devtools/system-deps.sh test"
)


def _render(template, **variables):
    values = {
        **DEFAULTS,
        **{k: v for k, v in group_vars().items() if not k.startswith("bundle_ports")},
        "ansible_managed": "test",
        **variables,
    }
    return ansible_like(DATA / "templates").get_template(template).render(**values)


def test_the_role_archives_wal_into_pgbackrest_and_backs_up_fast():
    settings = _render("postgresql.conf.j2").splitlines()
    for line in (
        "archive_mode = on",
        "archive_command = 'pgbackrest --stanza=bundle archive-push %p'",
        "archive_timeout = 60",
    ):
        assert line in settings, line
    config = _render("pgbackrest.conf.j2").splitlines()
    for line in (
        "[global]",
        "repo1-path=/var/lib/pgbackrest",
        "repo1-retention-full=2",
        "start-fast=y",
        "compress-type=zst",
        "[bundle]",
        "pg1-user=postgres",
        "pg1-port=5432",
    ):
        assert line in config, line


class ArchivingPostgres(PostgresServer):
    """Debian's initdb in a temporary folder, started with the data role's rendered
    settings (port, WAL archiving into pgBackRest) and its socket in the folder, so that
    pg_ctl starts it with no option (as the restore script does). pgBackRest's
    configuration, repository, logs and locks are in the folder too: the server's user
    (a dedicated one when the tests run as root) runs pgbackrest, as postgres does on a host."""

    def __init__(self):
        self.rendered_port = free_port()
        super().__init__()

    def _options(self):
        return ""  # everything is in the configuration files

    def start(self):
        self.port = self.rendered_port
        root = Path(self.root)
        self.pgbackrest_config = root / "pgbackrest.conf"
        # pgbackrest reads it: the server's archive_command, the test's and the script's calls.
        os.environ["PGBACKREST_CONFIG"] = str(self.pgbackrest_config)
        if not self.pgbackrest_config.exists():
            for folder in ("repo", "log", "spool", "lock"):
                (root / folder).mkdir()
            self.pgbackrest_config.write_text(self.render_pgbackrest())
            (Path(self.data) / "bundle.conf").write_text(
                _render("postgresql.conf.j2", bundle_postgresql_port=self.port)
            )
            with (Path(self.data) / "postgresql.conf").open("a") as handle:
                handle.write(f"\ninclude 'bundle.conf'\nunix_socket_directories = '{self.root}'\nfsync = off\n")
            if self.user:
                for path in [*root.rglob("*")]:
                    os.chown(path, *self.user)
        super().start()

    def render_pgbackrest(self, **variables):
        """The role's pgbackrest.conf for this server, its repository, logs and locks in its folder."""
        root = Path(self.root)
        text = _render(
            "pgbackrest.conf.j2",
            data_pgbackrest_repo_path=str(root / "repo"),
            data_pgbackrest_log_path=str(root / "log"),
            data_pgbackrest_spool_path=str(root / "spool"),
            data_postgresql_data_dir=self.data,
            data_postgresql_socket_dir=self.root,
            bundle_postgresql_port=self.port,
            data_pgbackrest_process_max=1,
            **variables,
        )
        return text.replace("[global]\n", f"[global]\nlock-path={root / 'lock'}\n", 1)

    def run_as(self):
        return {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user else {}

    def pgbackrest(self, *argv):
        done = subprocess.run(
            ["pgbackrest", f"--stanza={STANZA}", *argv],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=self.root,
            **self.run_as(),
        )
        assert done.returncode == 0, f"pgbackrest {argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        return done.stdout

    def connect(self, database="postgres"):
        return psycopg.connect(self.url(database), autocommit=True)

    def restore(self, *argv):
        """The role's restore script, with pg_ctl for the server."""
        return subprocess.run(
            [
                sys.executable,
                str(RESTORE),
                "--stanza",
                STANZA,
                "--run-as",
                "bundle-test-pg" if self.user else "",
                "--port",
                str(self.port),
                "--socket-dir",
                self.root,
                "--pg-ctl",
                os.path.join(self.bin, "pg_ctl"),
                "--pgdata",
                self.data,
                "--log",
                self.log,
                "--timeout",
                "120",
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )


@pytest.fixture
def archiving_postgres(monkeypatch):
    monkeypatch.setenv("PGBACKREST_CONFIG", "")  # set by the server's start, restored after the test
    server = ArchivingPostgres()
    try:
        yield server
    finally:
        server.close()


def _rows(server):
    with server.connect("bundle_notebook") as conn:
        return [row[0] for row in conn.execute("SELECT x FROM t ORDER BY x")]


def test_point_in_time_recovery_between_two_acknowledged_writes(archiving_postgres):
    server = archiving_postgres
    server.pgbackrest("stanza-create")
    server.pgbackrest("check")  # a WAL switch archived: archive_command works
    server.pgbackrest("--type=full", "backup")
    server.pgbackrest("verify")
    (backup,) = json.loads(server.pgbackrest("--output=json", "info"))[0]["backup"]
    assert backup["type"] == "full"
    # pgBackRest picks the backup of a time target by its stop time, in whole seconds:
    # the writes below come after the second it records.
    wait_for(lambda: time.time() > backup["timestamp"]["stop"] + 1, "the backup's second over", timeout=5)

    with server.connect() as conn:
        conn.execute("CREATE DATABASE bundle_notebook")
    with server.connect("bundle_notebook") as conn:
        conn.execute("CREATE TABLE t (x text)")
        conn.execute("INSERT INTO t VALUES ('A')")  # autocommit: acknowledged
        between = conn.execute(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'"
        ).fetchone()[0]
        conn.execute("INSERT INTO t VALUES ('B')")
        segment = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()[0]

    def archived():
        with server.connect() as conn:
            last = conn.execute("SELECT last_archived_wal FROM pg_stat_archiver").fetchone()[0]
        return last is not None and last[8:] >= segment[8:]

    wait_for(archived, f"WAL segment {segment} archived into pgBackRest's repository", timeout=60)
    assert _rows(server) == ["A", "B"]

    # A cluster that holds tables: refused, in one line, and nothing changed.
    refused = server.restore("--target-time", between)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "bundle-pg-restore: error: bundle_notebook hold tables: give --replace to overwrite them with the backup"
    ]
    assert _rows(server) == ["A", "B"]
    assert server.restore("--check").returncode == 1
    assert server.restore("--check", "--replace").returncode == 0
    bad = server.restore("--replace", "--target-time", "yesterday")
    assert bad.returncode == 2 and "is not 'YYYY-MM-DD HH:MM:SS+00'" in bad.stderr
    assert _rows(server) == ["A", "B"]

    # To the moment between A and B: A is there, B is not; the server takes writes.
    done = server.restore("--replace", "--target-time", between)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"to {between}; PostgreSQL accepts writes" in done.stdout
    assert "take a new full backup now" in done.stdout
    assert _rows(server) == ["A"]
    with server.connect("bundle_notebook") as conn:
        conn.execute("INSERT INTO t VALUES ('C')")
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False

    # To the end of the archived WAL of the first timeline (the one before the recovery
    # above branched off): both writes are back.
    done = server.restore("--replace", "--target-timeline", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "to the end of the archived WAL" in done.stdout
    assert _rows(server) == ["A", "B"]


def test_a_repository_without_backup_is_refused_before_the_server_stops(archiving_postgres):
    server = archiving_postgres
    server.pgbackrest("stanza-create")
    refused = server.restore()
    assert refused.returncode == 1
    assert "pgBackRest's repository has no backup of stanza bundle" in refused.stderr
    with server.connect() as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1  # still running


def test_the_status_file_is_written_whole_for_the_node_exporter(tmp_path):
    target = tmp_path / "bundle_backup_postgresql.prom"
    subprocess.run([sys.executable, str(STATUS), "postgresql", str(target)], check=True, timeout=60)
    lines = target.read_text().splitlines()
    assert lines[0] == "# TYPE bundle_backup_last_success_timestamp_seconds gauge"
    name, value = lines[1].rsplit(" ", 1)
    assert name == 'bundle_backup_last_success_timestamp_seconds{store="postgresql"}' and float(value) > 1.7e9
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary file left
    empty = subprocess.run(
        [sys.executable, str(STATUS), "postgresql"],
        env={**os.environ, "BUNDLE_BACKUP_STATUS_FILE": ""},
        timeout=60,
        check=True,
    )
    assert empty.returncode == 0


# --------------------------------------------------------------------------- the HA tier


def _ha_config(server, address, tls_port, tls_dir, standby_data, standby_port):
    """The HA tier's pgbackrest.conf as the member at `address` of 127.0.0.1-3 has it, in
    the server's folder. On hosts every member's cluster has the same folder and port; on
    one machine the standby's differ, so its lines (pg2) name them."""
    root = Path(server.root)
    text = server.render_pgbackrest(
        data_ha=True,
        data_ha_hosts=["127.0.0.1", "127.0.0.2", "127.0.0.3"],
        data_ha_address=address,
        data_pgbackrest_tls_port=tls_port,
        data_pgbackrest_tls_dir=str(tls_dir),
    )
    text = text.replace(f"pg2-path={server.data}\n", f"pg2-path={standby_data}\n")
    text = text.replace(f"pg2-port={server.port}\n", f"pg2-port={standby_port}\n")
    path = root / f"pgbackrest-{address}.conf"
    path.write_text(text)
    if server.user:
        os.chown(path, *server.user)
    return path


def _listens(address, port):
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
        return True
    return False


def test_the_ha_render_backs_up_through_the_other_members_servers_only():
    text = _render(
        "pgbackrest.conf.j2",
        data_ha=True,
        data_ha_hosts=["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        data_ha_address="10.0.0.2",
    )
    server_part, backup_part = text.split("[global:archive-push]")[0], text.split("[bundle:backup]")[1]
    assert "tls-server-address=10.0.0.2" in server_part and "tls-server-auth=bundle-pgbackrest=bundle" in server_part
    lines = backup_part.splitlines()
    assert "backup-standby=y" in lines
    assert "pg2-host=10.0.0.1" in lines and "pg3-host=10.0.0.3" in lines and "pg4-host" not in backup_part
    assert "pg2-host-type=tls" in lines and "pg1-host" not in text
    single = _render("pgbackrest.conf.j2")
    assert "tls-server" not in single and "[bundle:backup]" not in single


def test_the_certificate_is_issued_once_and_again_for_a_new_address_or_authority(tmp_path):
    secrets, folder = tmp_path / "secrets.json", tmp_path / "tls"
    subprocess.run([sys.executable, SECRETS, secrets, "ensure", "pgbackrest_tls_ca=tls_ca"], check=True, timeout=60)

    def issue(address):
        argv = [sys.executable, ISSUE_CERTIFICATE, secrets, folder, address, "--owner", getpass.getuser()]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout

    def names():
        argv = ["openssl", "x509", "-in", folder / "host.crt", "-noout", "-subject", "-ext", "subjectAltName"]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    assert issue("10.0.0.7") == "changed\n"
    assert "CN = bundle-pgbackrest" in names() and "IP Address:10.0.0.7, DNS:10.0.0.7" in names()
    assert stat_mode(folder / "host.key") == 0o600
    verified = subprocess.run(["openssl", "verify", "-CAfile", folder / "ca.crt", folder / "host.crt"], check=False)
    assert verified.returncode == 0
    key, certificate = (folder / "host.key").read_text(), (folder / "host.crt").read_text()
    assert issue("10.0.0.7") == ""  # a re-run changes nothing
    assert (folder / "host.crt").read_text() == certificate
    assert issue("10.0.0.8") == "changed\n"  # the host under a new address
    assert "DNS:10.0.0.8" in names() and (folder / "host.key").read_text() == key
    subprocess.run([sys.executable, SECRETS, secrets, "rotate", "pgbackrest_tls_ca=tls_ca"], check=True, timeout=60)
    assert issue("10.0.0.8") == "changed\n"  # a new authority: signed again
    assert json.loads(secrets.read_text())["pgbackrest_tls_ca"] == (folder / "ca.crt").read_text()


def stat_mode(path):
    return os.stat(path).st_mode & 0o777


def test_the_ha_backup_copies_from_a_standby_and_from_the_primary_when_none_answers(archiving_postgres, tmp_path):
    server = archiving_postgres
    server.pgbackrest("stanza-create")
    root, owner = Path(server.root), SERVER_USER if server.user else getpass.getuser()
    standby, standby_port, tls_port = root / "standby", free_port(), free_port()
    server._run("pg_basebackup", "-h", server.root, "-p", str(server.port), "-U", "postgres", "-D", standby, "-R")
    with (standby / "postgresql.auto.conf").open("a") as handle:
        handle.write(f"port = {standby_port}\n")
    server._run("pg_ctl", "start", "--pgdata", standby, "--wait", "--log", root / "standby.log")
    secrets, tls = tmp_path / "secrets.json", root / "tls"
    subprocess.run([sys.executable, SECRETS, secrets, "ensure", "pgbackrest_tls_ca=tls_ca"], check=True, timeout=60)
    subprocess.run([sys.executable, ISSUE_CERTIFICATE, secrets, tls, "127.0.0.2", "--owner", owner], check=True)
    standby_config = _ha_config(server, "127.0.0.2", tls_port, tls, standby, standby_port)
    primary_config = _ha_config(server, "127.0.0.1", tls_port, tls, standby, standby_port)
    # One machine: the standby's member serves on 127.0.0.2 with its certificate, which
    # the primary's pgBackRest presents too (on hosts, each its own, from one authority).
    member = subprocess.Popen(
        ["pgbackrest", "server"], env={**os.environ, "PGBACKREST_CONFIG": str(standby_config)}, **server.run_as()
    )
    try:
        wait_for(lambda: _listens("127.0.0.2", tls_port), "the standby's pgBackRest server", timeout=30)

        def backup(kind, **env):
            # As bundle-pg-backup@.service runs it (its EnvironmentFile, pg-backup.conf).
            environment = {**os.environ, "PGBACKREST_CONFIG": str(primary_config), "PGBACKREST_STANZA": STANZA, **env}
            argv = ["sh", str(BACKUP), kind]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=environment, **server.run_as())
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stderr

        # 127.0.0.3 has no server: a member down costs a warning (and io-timeout's wait).
        said = backup("full", PGBACKREST_IO_TIMEOUT="1")
        assert "unable to check pg3" in said and "no standby" not in said, said
        log = (root / "log" / f"{STANZA}-backup.log").read_text()
        assert "replay on the standby reached" in log, log[-3000:]
        member.terminate()
        member.wait(30)
        # No standby answers (127.0.0.3 has no server either): the primary's own files.
        said = backup("diff", PGBACKREST_IO_TIMEOUT="1")
        assert "no standby to copy from; backing up from the primary instead" in said, said
        backups = json.loads(server.pgbackrest("--output=json", "info"))[0]["backup"]
        assert [b["type"] for b in backups] == ["full", "diff"]
    finally:
        member.kill()
        member.wait(30)
        with contextlib.suppress(RuntimeError):
            server._run("pg_ctl", "stop", "--pgdata", standby, "--wait", "--mode", "immediate")
