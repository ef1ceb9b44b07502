"""Which processes serve from a folder: a restore must not move a data folder from
under a running service (the spec: a deck session's cached seq would be reused)."""

from __future__ import annotations

import os


def users_of(folder: str) -> list[str]:
    """'<pid> <command>' of each process that has its DATA_DIR, its working folder or
    an open file in `folder` (as far as this user may see)."""
    folder = os.path.realpath(folder)
    inside = folder.rstrip("/") + "/"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        if _uses(f"/proc/{pid}", folder, inside):
            found.append(f"{pid} {_command(pid)}")
    return found


def _uses(proc: str, folder: str, inside: str) -> bool:
    try:
        with open(f"{proc}/environ", "rb") as f:
            for variable in f.read().split(b"\0"):
                if variable.startswith(b"DATA_DIR=") and os.path.realpath(variable[9:].decode()) == folder:
                    return True
        links = [f"{proc}/cwd"] + [f"{proc}/fd/{fd}" for fd in os.listdir(f"{proc}/fd")]
    except OSError:  # gone, or not ours to read
        return False
    for link in links:
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target == folder or target.startswith(inside):
            return True
    return False


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"
