"""gunicorn under systemd: READY when every worker serves, and a reload that waits for it.

gunicorn's arbiter tells systemd READY=1 as soon as its socket is bound, before any
worker has loaded the app: `systemctl start` and `restart` would return while the
service cannot answer yet. Here (hooks of gunicorn.conf.py):

- `on_starting` (master, before gunicorn's own sd_notify): takes NOTIFY_SOCKET out of
  the environment, so gunicorn's notification is a no-op and no worker inherits it, and
  starts a thread that counts the workers that have loaded the app;
- `post_worker_init` (each worker, once the app is loaded): tells the master so, a line
  on a pipe made in `on_starting` (the worker inherits its write end by the fork);
- `child_exit` (master, a worker reaped): wakes the thread, which then counts again.

Once every current worker (as many as gunicorn runs) has reported, the thread sends
READY=1 and a STATUS= line to the saved NOTIFY_SOCKET, and writes the same state to
`$RUNTIME_DIRECTORY/gunicorn.json` (systemd's RuntimeDirectory=, /run/bundle-<service>/;
devtools.services makes one per service): the reload command below waits on that file.

Commands (`python -m gunicorn_systemd ...`):

- `reload <master pid>`: systemd's ExecReload=. Builds the app in a subprocess first (the
  service's environment, the code on disk); when that fails it prints why (the journal)
  and exits 1 without signalling anything: the old workers keep serving. Else it sends
  HUP (gunicorn starts new workers with the code on disk and stops the old ones
  gracefully; the master and its listening socket stay) and exits 0 once every worker
  of the new generation has loaded the app, 1 if the master died or time ran out.
- `exec-with-socket <fd> <program> [args...]`: hands the listening socket `fd` over as
  systemd's socket activation does (fd 3, LISTEN_FDS=1, LISTEN_PID=its own pid) and
  execs `program` in place (the dev runner and the tests: a parent cannot know the pid
  of its child before the fork, and a preexec_fn is unsafe in a threaded parent).

Imports the standard library only: the master loads this module before any worker
forks, and the gevent worker must patch before anything else is imported.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

STATE_FILE = "gunicorn.json"
# The preflight of a reload: what a new worker does (patch, then the app), in a process
# of its own, plus gunicorn.conf.py, which the master reads again on HUP (an error
# there would stop the master).
PREFLIGHT = (
    "import gevent.monkey; gevent.monkey.patch_all()\n"
    "import os, runpy; runpy.run_path('gunicorn.conf.py')\n"
    # What a worker loads: the module and its `app` (an import alone would not see it missing).
    "from gunicorn.util import import_app; import_app('wsgi:app')\n"
    # It registered as a live process, as a worker does: no row left behind.
    "from app.common import live_processes; live_processes.unregister_all()\n"
    "os._exit(0)"  # whatever the app started (threads, pools) must not hold the exit
)
PREFLIGHT_TIMEOUT = 60.0
# The whole reload, preflight included: below systemd's TimeoutStartSec= (90 s), which
# also bounds ExecReload=.
RELOAD_TIMEOUT = 75.0
# The thread counts again at least this often: a worker's report can arrive before
# the master has recorded that worker's pid (right after the fork).
RECOUNT_SECONDS = 1.0


class _Logger(Protocol):
    def info(self, msg: str, *args: object) -> None: ...

    def warning(self, msg: str, *args: object) -> None: ...


class _Arbiter(Protocol):
    """What is read of gunicorn's Arbiter (the hooks' `server`)."""

    WORKERS: dict[int, Any]
    num_workers: int
    pid: int
    log: _Logger


class _Readiness:
    """The master's side: the pipe the workers report on, and the thread that counts."""

    def __init__(self, arbiter: _Arbiter, notify_address: str | None, state_path: Path | None) -> None:
        self.arbiter, self.notify_address, self.state_path = arbiter, notify_address, state_path
        self.read_fd, self.write_fd = os.pipe()  # close-on-exec: only forks inherit them
        os.set_blocking(self.write_fd, False)
        self.loaded: set[int] = set()
        self.last: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
        self.ready = False

    def report(self, message: str) -> None:
        """From a worker ("+<pid>": loaded) or the master ("-<pid>": reaped); one small
        write, atomic on a pipe."""
        try:
            os.write(self.write_fd, f"{message}\n".encode())
        except BlockingIOError:  # the thread stopped reading: never block the master
            pass

    def run(self) -> None:
        pending = b""
        while True:
            try:
                pending = self.read_reports(pending)
                self.count()
            except Exception as exc:  # the thread must outlive a surprise: READY depends on it
                self.arbiter.log.warning("readiness: %s: %s", type(exc).__name__, exc)
                time.sleep(RECOUNT_SECONDS)

    def read_reports(self, pending: bytes) -> bytes:
        readable, _, _ = select.select([self.read_fd], [], [], RECOUNT_SECONDS)
        if readable:
            pending += os.read(self.read_fd, 4096)
            *lines, pending = pending.split(b"\n")
            for line in lines:
                pid = int(line[1:])
                if line.startswith(b"+"):
                    self.loaded.add(pid)
                else:
                    self.loaded.discard(pid)
        return pending

    def count(self) -> None:
        workers = tuple(sorted(dict(self.arbiter.WORKERS)))  # a copy: the main thread changes it
        wanted = self.arbiter.num_workers
        loaded = tuple(pid for pid in workers if pid in self.loaded)
        if (workers, loaded, wanted) == self.last:
            return
        self.last = (workers, loaded, wanted)
        ready = len(workers) == wanted and len(loaded) == wanted
        status = f"{len(loaded)} of {wanted} workers serving" + ("" if ready else " (starting or reloading)")
        if ready and not self.ready:
            self.arbiter.log.info("Every worker has loaded the app (%s): ready", len(loaded))
        # READY=1 again after a reload is harmless: systemd ignores it while active.
        message = f"STATUS={status}" + ("\nREADY=1" if ready and not self.ready else "")
        self.ready = ready
        self.write_state({"master": self.arbiter.pid, "workers": workers, "loaded": loaded, "ready": ready})
        if self.notify_address:
            notify(self.notify_address, message)

    def write_state(self, state: dict[str, object]) -> None:
        if self.state_path is None:
            return
        partial = self.state_path.with_suffix(".partial")
        try:
            partial.write_text(json.dumps(state))
            partial.replace(self.state_path)  # a reader sees the old state or the new one
        except OSError as exc:  # READY=1 still goes out; only a reload cannot wait
            self.arbiter.log.warning("Cannot write %s: %s", self.state_path, exc)


_readiness: _Readiness | None = None


def notify(address: str, message: str) -> None:
    """One datagram to systemd's notification socket (sd_notify); never blocks: a
    full queue (nobody reading, in a test) drops it."""
    target = "\0" + address[1:] if address.startswith("@") else address
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), socket.MSG_DONTWAIT, target)
        except OSError:
            pass


def state_path() -> Path | None:
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime) / STATE_FILE if runtime else None


# ----------------------------------------------------------------- gunicorn hooks


def on_starting(server: _Arbiter) -> None:
    global _readiness
    _readiness = _Readiness(server, os.environ.pop("NOTIFY_SOCKET", None), state_path())
    threading.Thread(target=_readiness.run, name="readiness", daemon=True).start()


def post_worker_init(worker: Any) -> None:
    if _readiness is not None:
        _readiness.report(f"+{os.getpid()}")


def child_exit(server: _Arbiter, worker: Any) -> None:
    if _readiness is not None:
        _readiness.report(f"-{worker.pid}")


# ----------------------------------------------------------------- commands


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_state(
    path: Path, master: int, condition: Callable[[dict[str, Any]], bool], deadline: float
) -> dict[str, Any] | None:
    """The master's state once `condition(state)` holds; None if the master died first.
    Raises TimeoutError past `deadline` (time.monotonic())."""
    while alive(master):
        state = read_state(path)
        if state is not None and state.get("master") == master and condition(state):
            return state
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.1)  # polling a condition with a deadline
    return None


def master_environment(master: int) -> dict[str, str] | None:
    """The environment `master` was started with (what its new workers inherit), or None
    when it cannot be read. Not this command's own: systemd reads the environment file
    afresh for ExecReload=, while HUP keeps the master's (a setting added to the file
    would pass the preflight and fail every new worker)."""
    try:
        raw = Path(f"/proc/{master}/environ").read_bytes()
    except OSError:
        return None
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def preflight(environment: dict[str, str] | None = None) -> str | None:
    """Why the code on disk does not load (its output), or None when it does."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PREFLIGHT],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=PREFLIGHT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"building the app took more than {PREFLIGHT_TIMEOUT:g} s"
    if done.returncode == 0:
        return None
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    return "\n".join(lines[-40:]) or f"exit status {done.returncode}"


def _wait_or_say(
    path: Path, master: int, condition: Callable[[dict[str, Any]], bool], deadline: float, late: str, gone: str
) -> dict[str, Any] | None:
    """wait_state, or None with `late` (past the deadline) or `gone` (the master died)
    said on standard error."""
    try:
        state = wait_state(path, master, condition, deadline)
    except TimeoutError:
        state, why = None, late
    else:
        why = gone
    if state is None:
        print(f"reload: {why}", file=sys.stderr)
    return state


def reload(master: int) -> int:
    path = state_path()
    if path is None:
        print("reload: RUNTIME_DIRECTORY is not set (RuntimeDirectory= of the unit)", file=sys.stderr)
        return 2
    deadline = time.monotonic() + RELOAD_TIMEOUT
    # A master still starting has no HUP handler yet; one that is replacing a worker
    # is let finish.
    state = _wait_or_say(
        path,
        master,
        lambda s: s["ready"],
        deadline,
        late=f"gunicorn {master} is not serving yet ({path}); nothing done",
        gone=f"no gunicorn master runs with pid {master}",
    )
    if state is None:
        return 1
    why = preflight(master_environment(master))
    if why is not None:
        print(f"reload refused: the code on disk does not load; the running workers keep serving:\n{why}")
        return 1
    old = set(state["workers"])
    try:
        os.kill(master, signal.SIGHUP)
    except ProcessLookupError:
        print(f"reload: gunicorn {master} exited before the reload", file=sys.stderr)
        return 1
    state = _wait_or_say(
        path,
        master,
        lambda s: s["ready"] and not old & set(s["workers"]),
        deadline,
        late=f"the new workers did not all load within {RELOAD_TIMEOUT:g} s",
        gone=f"gunicorn {master} exited during the reload (see its log)",
    )
    if state is None:
        return 1
    print(f"reloaded: workers {' '.join(map(str, state['workers']))} serve the code on disk")
    return 0


def exec_with_socket(fd: int, argv: list[str]) -> None:
    if fd != 3:
        os.dup2(fd, 3)  # inheritable
        os.close(fd)
    else:
        os.set_inheritable(3, True)
    os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
    os.execv(argv[0], argv)


USAGE = "usage: python -m gunicorn_systemd reload <master pid> | exec-with-socket <fd> <program> [args...]"


def main(args: list[str]) -> int:
    if len(args) == 2 and args[0] == "reload" and args[1].isdigit():
        return reload(int(args[1]))
    if len(args) >= 3 and args[0] == "exec-with-socket" and args[1].isdigit():
        exec_with_socket(int(args[1]), args[2:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
