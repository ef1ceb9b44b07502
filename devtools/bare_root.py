"""A bare Debian root to play a user's workspace (a container the user owns) in a test:
Debian minbase (12 by default; `suite=` another) with only python3, curl and ca-certificates
added, run in systemd-nspawn.

    root = ensure_bare_root()             # cached debootstrap root (built once, ~1 min)
    with Workspace.start(root, ["/bin/sh", "-c", "curl -fsS http://... | sh"],
                         hosts=["127.0.0.1 workspace.localhost"], env={"TOKEN": token},
                         log_path=tmp / "workspace.log") as ws:
        ws.processes("agent"); ws.run(["python3", "-V"]); ws.log()
    python -m devtools.bare_root build    # only build (or find) the cached root

No --boot and no systemd inside: `command` runs as PID 2 under nspawn's stub init (which
reaps zombies), in the host's network namespace like the staging box. Not app code.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.staging import CACHE, MIRROR, SUITE, StagingError, _alive, _descendants, _nspawn_command, _run
from devtools.waiting import wait_for

PACKAGES = ["python3", "curl", "ca-certificates"]
BARE_FORMAT = "3"  # bump to rebuild the cache when the build steps change


def ensure_bare_root(log=print, suite=SUITE):
    """The cached bare root, built if missing (same discipline as staging.ensure_root: a
    lock, built in a temporary directory and renamed into place, other keys removed)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(json.dumps([BARE_FORMAT, suite, PACKAGES]).encode()).hexdigest()[:16]
    target = CACHE / f"bare-{suite}-{key}"
    with open(CACHE / "bare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; others wait, then find it
        if target.is_dir():
            return target
        started = time.monotonic()
        log(f"bare root: building {target.name} (debootstrap)")
        debs = CACHE / "debs"  # staging's download cache, shared
        debs.mkdir(exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix="bare-build-", dir=CACHE))
        with open(CACHE / "lock", "w") as staging_lock:  # staging's builds write to debs too
            fcntl.flock(staging_lock, fcntl.LOCK_EX)
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    f"--cache-dir={debs}",
                    suite,
                    str(build),
                    MIRROR,
                ],
                timeout=1800,
            )
        # minbase has no /etc/hosts (lines are appended per run) and copies the host's hostname.
        (build / "etc/hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
        (build / "etc/hostname").write_text("workspace\n")
        # debootstrap leaves its .debs and apt's lists: not in a user's image, and half the per-run copy.
        for leftover in [*(build / "var/cache/apt/archives").glob("*.deb"), *(build / "var/lib/apt/lists").glob("*_*")]:
            leftover.unlink()
        build.chmod(0o755)
        build.rename(target)
        for other in CACHE.glob("bare-*"):  # this suite's older keys, killed builds, the unnamed format
            stale = other.name.startswith(("bare-build-", f"bare-{suite}-")) or re.fullmatch(
                r"bare-[0-9a-f]{16}", other.name
            )
            if other != target and stale:
                shutil.rmtree(other, ignore_errors=True)
        log(f"bare root: built in {time.monotonic() - started:.0f} s")
        return target


def unavailable():
    """Why this machine cannot run a workspace, or None."""
    if os.geteuid() != 0:
        return "the bare workspace needs root (debootstrap, systemd-nspawn)"
    for tool in ("systemd-nspawn", "debootstrap", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install systemd-container debootstrap)"
    return None


class Workspace:
    """A running copy of the bare root; see the module docstring."""

    def __init__(self, process, log_path):
        self.process, self.log_path = process, Path(log_path)

    @classmethod
    @contextlib.contextmanager
    def start(cls, root, command, hosts=(), env=None, log_path=None, timeout=30):
        """Copy `root` into a run directory and run `command` in it; on exit every process
        of it is killed and the run directory removed, whatever happened."""
        runs = CACHE / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix="workspace-", dir=runs))
        copy = run_dir / "root"
        workspace = None
        try:
            _run(["cp", "-a", "--reflink=auto", str(root), str(copy)], timeout=600)
            with open(copy / "etc/hosts", "a") as etc_hosts:
                etc_hosts.writelines(f"\n{line}" for line in hosts)
            # --setenv puts values on nspawn's command line (visible in /proc, never logged).
            # A machine name of its own: nspawn keys its /run/systemd/nspawn/propagate/<name> on it.
            # Hex only: mkdtemp's suffix may hold `_`, and a name may not end with a `-` either.
            machine = "workspace-" + hashlib.sha256(run_dir.name.encode()).hexdigest()[:16]
            options = [
                "--as-pid2",
                f"--machine={machine}",
                "--hostname=workspace",
                "--chdir=/root",
                "--setenv=HOME=/root",
                *[f"--setenv={k}={v}" for k, v in (env or {}).items()],
            ]
            log_path = Path(log_path or run_dir / "workspace.log")
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    _nspawn_command(copy, options, command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            workspace = cls(process, log_path)
            # Until its init is up, processes() and run() would find nothing to look at.
            wait_for(lambda: workspace.init_pid() or process.poll() is not None, "the workspace start", timeout)
            yield workspace
        finally:
            try:
                if workspace is not None:
                    workspace.kill()
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)

    def init_pid(self):
        """Host pid of the container's stub init (PID 1 of its PID namespace), or None."""
        return next((pid for pid in self._inside() if _nspids(pid)[-1:] == ["1"]), None)

    def _inside(self):
        """nspawn's descendants in another PID namespace: its own helper forks carry its
        command line (hence the workspace's command) and must not count."""
        depth = len(_nspids("self"))
        return [pid for pid in _descendants(self.process.pid) if len(_nspids(pid)) > depth]

    def processes(self, pattern):
        """Host pids of the workspace's processes whose command line contains `pattern`."""
        return [pid for pid in self._inside() if pattern in _read(pid, "cmdline").replace("\0", " ")]

    def run(self, argv, timeout=60):
        """Run argv inside the running workspace (nsenter); returns the CompletedProcess."""
        pid = self.init_pid()
        if pid is None:
            raise StagingError(f"the workspace is not running:\n{self.log()[-4000:]}")
        command = [
            "nsenter",
            "--target",
            str(pid),
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--root",
            "--wd",
            "env",
            "-i",
            "-C",
            "/root",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME=/root",
            "LANG=C.UTF-8",
            *map(str, argv),
        ]
        return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self):
        return self.process.poll() is None

    def kill(self, grace=5):
        """SIGTERM nspawn and all its descendants, SIGKILL what is left after `grace`
        seconds; raises StagingError if a process still survives."""
        # Taken before signalling: once nspawn is gone its orphans are no longer its descendants.
        tree = {self.process.pid, *_descendants(self.process.pid)}

        def gone():  # poll() also reaps nspawn, which would otherwise stay a zombie of ours
            return self.process.poll() is not None and not any(map(_alive, tree))

        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
            tree.update(_descendants(self.process.pid))
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(TimeoutError):
                wait_for(gone, "the workspace's exit", wait)
                return
        raise StagingError(f"processes of the workspace were left: {sorted(p for p in tree if _alive(p))}")


def _read(pid, name):
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""  # the process is gone


def _nspids(pid):
    """Its pid in each PID namespace it is in, outermost first ([] once it is gone)."""
    match = re.search(r"^NSpid:(.*)$", _read(pid, "status"), re.M)
    return match.group(1).split() if match else []


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["build"]:
        sys.exit("usage: python -m devtools.bare_root build")
    reason = unavailable()
    if reason:
        sys.exit(f"bare root: {reason}")
    print(ensure_bare_root())
    return 0


if __name__ == "__main__":
    sys.exit(main())
