"""The staging box: a Debian 12 root booted with systemd in systemd-nspawn, provisioned
by the real ops/bootstrap.sh (ansible-pull) from a git copy of this working tree.

    root = ensure_root()                 # cached debootstrap root (built once, ~3 min)
    with Box.boot(root) as box:          # a copy of it, booted with --boot --register=no
        box.run("systemctl", "is-active", "nginx")
    python -m devtools.staging build     # only build (or find) the cached root
    python -m devtools.staging shell     # boot, provision, and print how to enter it

The box shares the host's network namespace (no veth, no routing to set up): every
port its nginx, services and identity provider listen on is a loopback port chosen
for the run, passed to the playbook as variables. systemd runs only inside the box,
as PID 1 of its own PID namespace, never on the host. Not app code: imports nothing
from app/.
"""

import argparse
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("BUNDLE_STAGING_CACHE", "/var/cache/bundle-staging"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What booting and entering the box needs; the rest comes from the playbook's own
# package lists, so the cache is rebuilt when they change (and the playbook's apt
# tasks find everything installed, which keeps a staging run short).
BOOT_PACKAGES = ["systemd", "systemd-sysv", "dbus", "ca-certificates", "procps", "iproute2"]
CACHE_FORMAT = "1"  # bump to rebuild every cache when the build steps change


class StagingError(RuntimeError):
    pass


def _yaml(path):
    return yaml.safe_load(Path(path).read_text()) or {}


def bootstrap_packages():
    """The packages ops/bootstrap.sh installs (its PACKAGES=(...) line)."""
    match = re.search(r"^PACKAGES=\(([^)]*)\)", (ROOT / "ops/bootstrap.sh").read_text(), re.M)
    if not match:
        raise StagingError("ops/bootstrap.sh has no PACKAGES=(...) line")
    return match.group(1).split()


def playbook_packages():
    """Every Debian package the roles and bootstrap.sh install."""
    base = _yaml(ROOT / "ops/roles/base/defaults/main.yml")["base_packages"]
    nginx = _yaml(ROOT / "ops/roles/nginx/defaults/main.yml")
    web = nginx["nginx_packages"] + nginx["nginx_acme_packages"]
    backup = _yaml(ROOT / "ops/roles/backup/defaults/main.yml")["backup_packages"]
    return sorted(set(base) | set(web) | set(backup) | set(bootstrap_packages()))


def cache_key():
    text = json.dumps([CACHE_FORMAT, SUITE, BOOT_PACKAGES, playbook_packages()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _run(command, timeout, **kwargs):
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if result.returncode != 0:
        raise StagingError(
            f"{' '.join(map(str, command))} exited with {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def ensure_root(log=print):
    """The cached Debian root for the current package lists, built if missing. Built in a
    temporary directory and renamed into place, so a killed build never leaves a half
    cache; other keys' roots are removed after a build."""
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"root-{cache_key()}"
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; others wait, then find it
        if target.is_dir():
            return target
        for stale in CACHE.glob("build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        build = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE))
        started = time.monotonic()
        log(f"staging: building the Debian root {target.name} (debootstrap, a few minutes)")
        debs = CACHE / "debs"
        debs.mkdir(exist_ok=True)
        # debootstrap does not resolve virtual packages: only the boot set here, the rest
        # with apt inside the new root.
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BOOT_PACKAGES)}",
                f"--cache-dir={debs}",
                SUITE,
                str(build),
                MIRROR,
            ],
            timeout=1800,
        )
        _run(
            _nspawn_command(
                build,
                ["--bind", f"{debs}:/var/cache/apt/archives"],
                [
                    "/bin/sh",
                    "-c",
                    "apt-get update -q && DEBIAN_FRONTEND=noninteractive "
                    "apt-get install -y -q --no-install-recommends " + " ".join(playbook_packages()),
                ],
            ),
            timeout=1800,
        )
        # Debian's default site listens on port 80 of the (shared) network namespace.
        (build / "etc/nginx/sites-enabled/default").unlink(missing_ok=True)
        (build / "etc/hostname").write_text("bundle-staging\n")
        (build / "etc/machine-id").write_text("")  # a new one at each boot
        build.chmod(0o755)
        build.rename(target)
        for other in CACHE.glob("root-*"):
            if other != target:
                shutil.rmtree(other, ignore_errors=True)
        log(f"staging: root built in {time.monotonic() - started:.0f} s")
        return target


def _nspawn_command(root, options, command):
    """systemd-nspawn on `root`. --keep-unit and --register=no: the host runs no systemd
    (and no bus) to ask for a scope or register with."""
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",
        "--keep-unit",
        "--resolv-conf=copy-host",
        "--timezone=off",
        "-D",
        str(root),
        *options,
        *command,
    ]


def nspawn_unavailable():
    """Why this machine cannot boot a box, or None."""
    if os.geteuid() != 0:
        return "the staging box needs root (debootstrap, systemd-nspawn)"
    for tool in ("systemd-nspawn", "debootstrap", "nsenter", "git"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install systemd-container debootstrap)"
    return None


def publish_snapshot(folder, commit=None):
    """The working tree (snapshot_commit), or `commit`, as the branch `staging` of a new
    bare repository `folder/bundle.git`, for a box to ansible-pull from; returns (that
    repository's path, that commit's ops/bootstrap.sh text)."""
    repo = Path(folder) / "bundle.git"
    _run(["git", "init", "--quiet", "--bare", str(repo)], timeout=60)
    return repo, publish(repo, commit or snapshot_commit())


def publish(repo, commit):
    """`commit` as the branch `staging` of `repo` (a later release over an earlier one:
    the next ansible-pull upgrades); returns its ops/bootstrap.sh text."""
    _run(["git", "-C", str(ROOT), "push", "--quiet", "--force", str(repo), f"{commit}:refs/heads/staging"], timeout=300)
    return _run(["git", "-C", str(ROOT), "show", f"{commit}:ops/bootstrap.sh"], timeout=60).stdout


def snapshot_commit(repo=ROOT, message="staging snapshot of the working tree"):
    """A commit of the WORKING TREE as it is on disk (tracked changes, untracked files
    that are not ignored), made with a temporary index: the real index, HEAD and the
    branches are untouched. Returns the commit id (its objects are in repo's .git)."""
    with tempfile.TemporaryDirectory(prefix="bundle-index-") as tmp:
        env = {
            **os.environ,
            "GIT_INDEX_FILE": str(Path(tmp) / "index"),
            "GIT_AUTHOR_NAME": "staging",
            "GIT_AUTHOR_EMAIL": "staging@localhost",
            "GIT_COMMITTER_NAME": "staging",
            "GIT_COMMITTER_EMAIL": "staging@localhost",
        }
        git = ["git", "-C", str(repo)]
        _run([*git, "add", "-A"], timeout=120, env=env)
        tree = _run([*git, "write-tree"], timeout=60, env=env).stdout.strip()
        return _run([*git, "commit-tree", tree, "-m", message], timeout=60, env=env).stdout.strip()


class Box:
    """A booted box. run(*argv) runs a command inside (nsenter into its namespaces);
    poweroff() stops it and checks that none of its processes is left."""

    def __init__(self, root, process, log_path, netns=None):
        self.root, self.process, self.log_path = Path(root), process, Path(log_path)
        self.netns = netns

    @classmethod
    @contextlib.contextmanager
    def boot(cls, cached_root, binds=(), ro_binds=(), workdir=None, timeout=120, netns=None):
        """Copy `cached_root` into a run directory and boot it; powered off and removed
        on exit, whatever happened. binds / ro_binds: (host path, box path) pairs.
        netns: the network namespace it runs in (devtools/private_network.py); by
        default it shares this machine's."""
        runs = CACHE / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        run_dir = Path(workdir or tempfile.mkdtemp(prefix="box-", dir=runs))
        root = run_dir / "root"
        box = None
        try:
            _run(["cp", "-a", "--reflink=auto", str(cached_root), str(root)], timeout=600)
            machine = "bundle-" + re.sub(r"[^A-Za-z0-9]", "", run_dir.name)
            options = ["--boot", "--console=read-only", f"--machine={machine}"]
            if netns:
                options.append(f"--network-namespace-path=/run/netns/{netns}")
            for host, inside in binds:
                options += ["--bind", f"{host}:{inside}"]
            for host, inside in ro_binds:
                options += ["--bind-ro", f"{host}:{inside}"]
            log_path = run_dir / "console.log"
            with open(log_path, "wb") as log:
                process = subprocess.Popen(
                    _nspawn_command(root, options, []),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            box = cls(root, process, log_path, netns)
            box.wait_booted(timeout)
            yield box
        finally:
            try:
                if box is not None:
                    box.poweroff()
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)

    # --- inside the box -------------------------------------------------------------------

    def init_pid(self):
        """The pid (in the host's namespace) of the box's systemd, or None."""
        for pid in _descendants(self.process.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd" and os.readlink(
                    f"/proc/{pid}/ns/pid"
                ) != os.readlink("/proc/self/ns/pid"):
                    status = Path(f"/proc/{pid}/status").read_text()
                    if re.search(r"^NSpid:\s+\d+\s+1$", status, re.M):
                        return pid
            except OSError:
                continue
        return None

    def command(self, *argv, env=None):
        pid = self.init_pid()
        if pid is None:
            raise StagingError(f"the box is not running:\n{self.console_tail()}")
        environment = [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME=/root",
            "LANG=C.UTF-8",
            "TERM=dumb",
            *[f"{k}={v}" for k, v in (env or {}).items()],
        ]
        namespaces = ["--mount", "--uts", "--ipc", "--pid", "--cgroup", *(["--net"] if self.netns else [])]
        return [
            "nsenter",
            "--target",
            str(pid),
            *namespaces,
            "--root",
            "--wd",
            "env",
            "-i",
            "-C",
            "/",
            *environment,
            *map(str, argv),
        ]

    def run(self, *argv, check=True, timeout=120, env=None, input=None):
        """Run argv inside the box; returns the CompletedProcess (text)."""
        result = subprocess.run(
            self.command(*argv, env=env),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise StagingError(
                f"in the box: {' '.join(map(str, argv))} exited with "
                f"{result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def trust_host_certificates(self):
        """The box trusts the CAs the host adds to Debian's (e.g. a TLS-inspecting egress
        proxy in front of PyPI), for apt, git and pip alike (pip reads its own bundle
        unless told)."""
        for path in sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt")):
            self.run("sh", "-c", f"cat > /usr/local/share/ca-certificates/host-{path.name}", input=path.read_text())
        self.run("update-ca-certificates", timeout=120)
        self.run("sh", "-c", "cat > /etc/pip.conf", input="[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")

    def console_tail(self, size=4000):
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def wait_booted(self, timeout):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StagingError(f"systemd-nspawn exited with {self.process.returncode}:\n{self.console_tail()}")
            if self.init_pid() is not None:
                state = self.run("systemctl", "is-system-running", check=False, timeout=30).stdout.strip()
                if state in ("running", "degraded"):
                    return state
            time.sleep(0.5)  # polling for the boot to finish, with a deadline
        raise StagingError(f"the box did not finish booting in {timeout} s (state {state!r}):\n{self.console_tail()}")

    def poweroff(self, timeout=60):
        """`systemctl poweroff` inside, then wait for nspawn to exit; SIGKILL past the
        time-out. Raises StagingError if a process of the box is left afterwards."""
        pids_before = set(_descendants(self.process.pid)) | {self.process.pid}
        if self.process.poll() is None:
            if self.init_pid() is not None:
                subprocess.run(
                    self.command("systemctl", "poweroff", "--no-block"),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                )
            else:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        deadline = time.monotonic() + 30
        left = pids_before
        while time.monotonic() < deadline:
            left = {pid for pid in pids_before if _alive(pid)}
            if not left:
                return
            time.sleep(0.2)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise StagingError(f"processes of the box were left after poweroff: {sorted(left)}")


def _children(pid):
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = []
    for task in tasks:
        with contextlib.suppress(OSError):
            found += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def _descendants(pid):
    seen, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:
                seen.append(child)
                todo.append(child)
    return seen


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m devtools.staging", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["build", "key"])
    args = parser.parse_args(argv)
    if args.command == "key":
        print(cache_key(), " ".join(playbook_packages()))
        return 0
    reason = nspawn_unavailable()
    if reason:
        parser.exit(2, f"staging: {reason}\n")
    print(ensure_root())
    return 0


if __name__ == "__main__":
    sys.exit(main())
