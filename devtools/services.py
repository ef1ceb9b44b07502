"""Start a service the way production does:

    SERVICE=<name> PORT=<port> DATA_DIR=<dir> .venv/bin/gunicorn -c gunicorn.conf.py wsgi:app

on a listening socket made here and handed over as systemd's bundle@.socket hands it
(fd 3, LISTEN_FDS, LISTEN_PID), with a NOTIFY_SOCKET read here: a start returns once
gunicorn says READY=1, which gunicorn.conf.py sends only when every worker has loaded
the app (gunicorn_systemd.py). A restart keeps the socket, so connections made while
no worker serves wait in the kernel's queue instead of being refused.

Used by the dev runner, the test fixtures and the benchmarks.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from app import registry

ROOT = Path(__file__).resolve().parents[1]
GUNICORN = ROOT / ".venv" / "bin" / "gunicorn"
PYTHON = ROOT / ".venv" / "bin" / "python"
PORTS = registry.PORTS  # each service's loopback port, as gunicorn.conf.py
HEALTH_PATHS = {s.name: s.health for s in registry.SERVICES}  # each service's health route
BACKLOG = 4096  # as bundle@.socket's Backlog=


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
    """A service started by `start()`: gunicorn on a listening socket this process
    holds (as systemd's bundle@.socket does), so `restart()` and `reload()` refuse no
    connection; `stop()` closes it."""

    def __init__(self, name, port, data_dir, process=None, env=None, listener=None, workers=1, root=ROOT, **popen):
        self.name, self.port, self.data_dir, self.process = name, port, data_dir, process
        self.env = env or {}  # what the caller set on top of the environment (DATABASE_URL...)
        self.listener, self.workers, self.root, self.popen = listener, workers, Path(root), popen
        self.base_url = f"http://127.0.0.1:{port}"
        self.runtime_dir = self.notifications = None
        if listener is not None:  # else a process started elsewhere (devtools.release_dumps)
            # systemd's notification socket and RuntimeDirectory=, one per service.
            self.runtime_dir = Path(tempfile.mkdtemp(prefix=f"bundle-{name}-"))
            self.notifications = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self.notifications.bind(f"\0bundle-notify-{os.getpid()}-{self.runtime_dir.name}")

    def environment(self):
        """The environment of the service's processes (gunicorn, the reload command)."""
        return {
            **os.environ,
            "SERVICE": self.name,
            "HOST": self.listener.getsockname()[0],
            "PORT": str(self.port),
            "DATA_DIR": str(self.data_dir),
            "WEB_CONCURRENCY": str(self.workers),
            "NOTIFY_SOCKET": "@" + self.notifications.getsockname()[1:].decode(),
            "RUNTIME_DIRECTORY": str(self.runtime_dir),
            **self.env,
        }

    def launch(self, timeout=60.0):
        """Start gunicorn on the held socket and wait until it says READY=1 (every
        worker has loaded the app)."""
        self._drain()
        shim = [str(PYTHON), "-m", "gunicorn_systemd", "exec-with-socket", str(self.listener.fileno())]
        self.process = subprocess.Popen(
            [*shim, str(GUNICORN), "-c", "gunicorn.conf.py", "wsgi:app"],
            cwd=self.root,
            env=self.environment(),
            pass_fds=(self.listener.fileno(),),
            **self.popen,
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            raise

    def _drain(self):
        """Forget the notifications of an earlier process."""
        self.notifications.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                self.notifications.recv(4096)

    def wait_ready(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before it was ready")
            self.notifications.settimeout(0.2)  # to look at the process between datagrams
            try:
                message = self.notifications.recv(4096).decode()
            except TimeoutError:
                continue
            if "READY=1" in message.splitlines():
                self.ready_message = message  # with the STATUS= line sent beside it
                return
        raise TimeoutError(f"{self.name} did not say READY=1 within {timeout:g} s")

    def stop(self, timeout=20.0):
        """SIGTERM and wait; returns the seconds it took. Kills it past `timeout`. The
        socket is closed after (a connection is refused from then on)."""
        try:
            return terminate(self.process, timeout)
        finally:
            self.close()

    def close(self):
        """Close the socket held for the service (and its notification socket)."""
        if self.listener is not None:
            self.listener.close()
            self.notifications.close()
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    def restart(self, stop_timeout=20.0):
        """As `systemctl restart`: SIGTERM, wait, start again on the same socket (a
        connection made meanwhile waits in the kernel's queue). Returns the seconds
        the stop took."""
        took = terminate(self.process, stop_timeout)
        self.launch()
        return took

    def reload(self, check=True):
        """As `systemctl reload`: the reload command (ExecReload= of bundle@.service) on
        gunicorn's master; it returns once the new workers serve. Returns its
        CompletedProcess (its output in `stdout`); a failure raises RuntimeError
        unless `check` is false."""
        done = subprocess.run(
            [str(PYTHON), "-m", "gunicorn_systemd", "reload", str(self.process.pid)],
            cwd=self.root,
            env=self.environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"reloading {self.name} failed ({done.returncode}):\n{done.stdout}")
        return done

    def worker_pids(self):
        """The pids of the gunicorn workers (children of the arbiter)."""
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []


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


def listen(host, port):
    """A listening TCP socket on `host`:`port` (0: a free port), as bundle@.socket
    makes it (its Backlog= and NoDelay=)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind((host, port))
        listener.listen(BACKLOG)
    except OSError as exc:
        listener.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return listener


def start(
    name,
    data_dir,
    port=None,
    env=None,
    workers=1,
    stdout=None,
    stderr=None,
    host="127.0.0.1",
    own_session=False,
    root=ROOT,
):
    """Start `name` under gunicorn as systemd does (the listening socket made here and
    handed over, READY=1 awaited: every worker has loaded the app). `own_session`: out
    of the caller's process group, so a Ctrl-C in a terminal reaches only the caller,
    which then stops the service gracefully. `root`: the tree whose code it runs (a
    copy of the checkout; this checkout's venv)."""
    listener = listen(host, port or 0)
    service = RunningService(
        name,
        listener.getsockname()[1],
        data_dir,
        env=env,
        listener=listener,
        workers=workers,
        root=root,
        stdout=stdout,
        stderr=stderr,
        start_new_session=own_session,
    )
    try:
        service.launch()
    except BaseException:
        service.close()
        raise
    return service


if __name__ == "__main__":
    sys.exit("use devtools.run (make run) to run the bundle")
