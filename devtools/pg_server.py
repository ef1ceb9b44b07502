"""A throwaway PostgreSQL server for tests and benches: Debian's `initdb` and `pg_ctl`
in a temporary folder, on a free loopback port.

    with PostgresServer() as pg:
        url = pg.new_database()          # postgresql://postgres@127.0.0.1:<port>/<name>
        pg.restart()                     # a fault: every connection is cut

PostgreSQL refuses to run as root: as root the server runs as a dedicated system user
(created on first use); as anyone else, as that user. Durability is off (fsync,
synchronous_commit): a test server never outlives its test session.
"""

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid

import psycopg

from devtools.services import free_port

SERVER_USER = "bundle-test-pg"


def server_bin_dir():
    """The newest installed PostgreSQL's server programs (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL's server is not installed: apt-get install postgresql")
    return os.path.dirname(found[-1])


def _server_user():
    """(uid, gid) to run the server as: a system user when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVER_USER], check=True
        )
        entry = pwd.getpwnam(SERVER_USER)
    return entry.pw_uid, entry.pw_gid


class PostgresServer:
    def __init__(self, max_connections=400):
        self.bin = server_bin_dir()
        self.user = _server_user()
        self.port = free_port()
        self.max_connections = max_connections
        self.root = tempfile.mkdtemp(prefix="bundle-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        if self.user:
            os.chown(self.root, *self.user)
        self._run(
            "initdb",
            "--pgdata",
            self.data,
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C.UTF-8",
            "--no-sync",
            "--no-instructions",
        )
        self.start()

    def _run(self, program, *args):
        kwargs = {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user else {}
        done = subprocess.run(
            [os.path.join(self.bin, program), *args], cwd=self.root, capture_output=True, text=True, **kwargs
        )
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def _options(self):
        return (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
            f" -c synchronous_commit=off -c full_page_writes=off -c max_connections={self.max_connections}"
        )

    def start(self):
        self._run("pg_ctl", "start", "--pgdata", self.data, "--wait", "--log", self.log, "-o", self._options())

    def stop(self, mode="fast"):
        self._run("pg_ctl", "stop", "--pgdata", self.data, "--wait", "--mode", mode)

    def restart(self):
        """Stop (cutting every connection) and start again on the same port."""
        self.stop()
        self.start()

    def url(self, database="postgres"):
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix="test"):
        """A new empty database; its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self):
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
