"""A throwaway Redis server for tests and benches: Debian's `redis-server` in a
temporary folder, on a free loopback port, with a password and its append-only file
(so that a restart keeps what it acknowledged, as the data role configures it).

    with RedisServer() as redis_server:
        url = redis_server.url(db=3)     # redis://:<password>@127.0.0.1:<port>/3
        redis_server.restart()           # a fault: every connection is cut
"""

import os
import secrets
import shutil
import signal
import subprocess
import tempfile

import redis

from devtools.services import free_port
from devtools.waiting import wait_for


class RedisServer:
    def __init__(self):
        self.port = free_port()
        self.password = secrets.token_hex(12)
        self.root = tempfile.mkdtemp(prefix="bundle-redis-")
        self.process = None
        self._next_db = 0
        self.start()

    def start(self):
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.root,
                "--requirepass",
                self.password,
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--databases",
                "64",
                "--daemonize",
                "no",
                "--logfile",
                os.path.join(self.root, "server.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, "redis-server answering", timeout=30)

    def _answers(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.process.returncode}")
        try:
            return redis.Redis.from_url(self.url(), socket_timeout=1).ping()
        except redis.exceptions.ConnectionError:
            return False

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # redis-server flushes its append-only file and exits
            self.process.wait(30)

    def restart(self):
        """Stop (cutting every connection) and start again on the same port, with the same data."""
        self.stop()
        self.start()

    def url(self, db=0):
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"

    def new_url(self):
        """The URL of a database number no one else was given (of 64)."""
        self._next_db = (self._next_db % 63) + 1
        url = self.url(self._next_db)
        redis.Redis.from_url(url).flushdb()
        return url

    def close(self):
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
