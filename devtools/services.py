"""Start a service the way production does:

    SERVICE=<name> PORT=<port> DATA_DIR=<dir> .venv/bin/gunicorn -c gunicorn.conf.py wsgi:app

Used by the dev runner, the test fixtures and the benchmarks.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from app import registry
from devtools.waiting import wait_for
from devtools.worker_sockets import connection_workers

ROOT = Path(__file__).resolve().parents[1]
GUNICORN = ROOT / ".venv" / "bin" / "gunicorn"
PORTS = registry.PORTS  # each service's loopback port, as gunicorn.conf.py
HEALTH_PATHS = {s.name: s.health for s in registry.SERVICES}  # the route a start waits on


def accepts(port, address="127.0.0.1"):
    """Whether something listens on `port` (a connection is made and closed)."""
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def free_port(address="127.0.0.1"):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def held_port(address="127.0.0.1"):
    """A free port, kept bound (not listening) while the block runs: a server the block
    starts on port 0 meanwhile (a provider whose configuration names this port) cannot
    be handed the same one. Whatever is to listen on it binds after the block."""
    with socket.socket() as held:
        held.bind((address, 0))
        yield held.getsockname()[1]


def terminate(process, timeout):
    """SIGTERM `process` and wait for it; past `timeout` it is killed and
    subprocess.TimeoutExpired is raised. Returns the seconds it took."""
    started = time.monotonic()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return time.monotonic() - started


def stop_all(processes, timeout=10.0):
    """Terminate `processes`, the last started first; one that does not stop within
    `timeout` is killed, and the others are still stopped. Closes a stdin pipe first
    (a process that waits on its input then sees its end)."""
    for process in reversed(processes):
        if process.stdin:
            process.stdin.close()
        try:
            terminate(process, timeout)
        except subprocess.TimeoutExpired:
            pass  # killed by terminate()


class ProcessGroup:
    """Processes started together by `start()` (which returns self) and stopped
    together, the last started first; a context manager."""

    def __init__(self):
        self.processes = []

    def stop(self):
        stop_all(self.processes)
        self.processes = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class RunningService:
    def __init__(self, name, port, data_dir, process, env=None):
        self.name, self.port, self.data_dir, self.process = name, port, data_dir, process
        self.env = env or {}  # what the caller set on top of the environment (DATABASE_URL...)
        self.base_url = f"http://127.0.0.1:{port}"

    def stop(self, timeout=20.0):
        """SIGTERM and wait; returns the seconds it took. Kills it past `timeout`."""
        return terminate(self.process, timeout)

    def worker_pids(self):
        """The pids of the gunicorn workers (children of the arbiter)."""
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def wait_every_worker(self, workers, timeout=30.0):
        """Until each of the `workers` workers has loaded the app: a gunicorn worker
        accepts connections only after, and the health route's answer comes from
        whichever was first. Connections are opened until every worker has accepted
        one (the kernel hands each to a worker that is ready); one not accepted yet
        is held, the others closed."""
        waiting, seen = [], set()

        def every_worker_accepted_one():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} while its workers started")
            try:
                waiting.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
            except OSError:
                return False  # the arbiter closed its socket: a worker failed, it is exiting
            holders = connection_workers(self.port, self.worker_pids())
            for sock in list(waiting):
                holder = holders.get(sock.getsockname()[1])
                if holder is not None:
                    seen.add(holder)
                    waiting.remove(sock)
                    sock.close()
            return len(seen) >= workers

        try:
            wait_for(every_worker_accepted_one, f"all {workers} workers of {self.name} to serve", timeout)
        finally:
            for sock in waiting:
                sock.close()


def wait_healthy(url, timeout=30.0, process=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the service exited with {process.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)  # polling for readiness, not papering over a race
    raise TimeoutError(f"{url} did not answer 200 within {timeout} s")


def start(
    name, data_dir, port=None, env=None, workers=1, stdout=None, stderr=None, host="127.0.0.1", own_session=False
):
    """Start `name` under gunicorn and wait until its health route answers.
    `own_session`: out of the caller's process group, so a Ctrl-C in a terminal
    reaches only the caller, which then stops the service gracefully."""
    port = port or free_port()
    environment = {
        **os.environ,
        "SERVICE": name,
        "HOST": host,
        "PORT": str(port),
        "DATA_DIR": str(data_dir),
        "WEB_CONCURRENCY": str(workers),
        **(env or {}),
    }
    process = subprocess.Popen(
        [str(GUNICORN), "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env=environment,
        stdout=stdout,
        stderr=stderr,
        start_new_session=own_session,
    )
    service = RunningService(name, port, data_dir, process, env)
    try:
        wait_healthy(service.base_url + HEALTH_PATHS.get(name, "/healthz"), process=process)
        if workers > 1:
            service.wait_every_worker(workers)
    except BaseException:
        if process.poll() is None:
            process.kill()
        process.wait()
        raise
    return service


if __name__ == "__main__":
    sys.exit("use devtools.run (make run) to run the bundle")
