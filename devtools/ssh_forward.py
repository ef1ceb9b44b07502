"""An SSH port forward, the reference for the workspace apps tunnel: what a user would
otherwise run to reach an app in a workspace. Debian's sshd on a private loopback port
(key-only, this user, keys made for the run) and `ssh -L` forwarding a local port to
the app.

    with SshForward(folder, app_port) as forward:
        forward.port        # connect here to reach 127.0.0.1:<app_port> through ssh
        forward.pids()      # sshd's and ssh's processes (their CPU is the path's)

`terminal=True` (the default) keeps a remote command on a terminal (`ssh -tt`), as a user
with a shell open has: ssh then sets TCP_NODELAY on its connection; `ssh -N` does not,
and small requests wait on Nagle. Not app code.
"""

import getpass
import os
import shutil
import subprocess
from pathlib import Path

from devtools.services import ProcessGroup, accepts, free_port
from devtools.waiting import wait_for

SSHD = "/usr/sbin/sshd"


def unavailable():
    missing = [tool for tool in (SSHD, "ssh", "ssh-keygen") if not shutil.which(tool)]
    return f"{', '.join(missing)} not installed (apt-get install openssh-server openssh-client)" if missing else None


class SshForward(ProcessGroup):
    def __init__(self, folder, target_port, terminal=True):
        super().__init__()
        self.folder, self.target_port, self.terminal = Path(folder), target_port, terminal
        self.sshd_port, self.port = free_port(), free_port()

    def _keys(self):
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.folder / name)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        (self.folder / "authorized_keys").write_text((self.folder / "client_key.pub").read_text())

    def _sshd_config(self):
        path = self.folder / "sshd_config"
        path.write_text(f"""Port {self.sshd_port}
ListenAddress 127.0.0.1
HostKey {self.folder}/host_key
PidFile {self.folder}/sshd.pid
AuthorizedKeysFile {self.folder}/authorized_keys
AllowUsers {getpass.getuser()}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
AllowTcpForwarding local
PermitTTY yes
PrintMotd no
""")
        return path

    def start(self):
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._keys()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation folder
        command = [
            "ssh",
            "-i",
            str(self.folder / "client_key"),
            "-p",
            str(self.sshd_port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-L",
            f"127.0.0.1:{self.port}:127.0.0.1:{self.target_port}",
        ]
        command += (
            ["-tt", f"{getpass.getuser()}@127.0.0.1", "sleep 86400"]
            if self.terminal
            else ["-N", f"{getpass.getuser()}@127.0.0.1"]
        )
        try:
            with open(self.folder / "ssh.log", "ab") as log:  # each child keeps its own descriptor
                self.processes.append(
                    subprocess.Popen(
                        [SSHD, "-D", "-e", "-f", str(self._sshd_config())],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                    )
                )
                wait_for(lambda: accepts(self.sshd_port), "sshd to listen", timeout=30)
                # stdin a pipe never written: the remote terminal stays open, as a user's would.
                self.processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log))
            wait_for(self._forwarding, "ssh to forward its local port", timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def _forwarding(self):
        if self.processes[-1].poll() is not None:
            raise RuntimeError("ssh exited: " + (self.folder / "ssh.log").read_text(errors="replace")[-1000:])
        return accepts(self.port)

    def pids(self):
        """sshd (the listener and its session children) and ssh."""
        found = []
        for process in self.processes:
            found.append(process.pid)
            found += _descendants(process.pid)
        return found


def _descendants(pid):
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return children + [grand for child in children for grand in _descendants(child)]
