"""File-system helpers: atomic writes, JSON files and containment checks."""

import json
import os
import uuid
from typing import Any


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Write `data` (bytes) to `path` so that a reader sees the old file or the whole
    new one: a temporary file beside it, fsynced, renamed over, directory fsynced."""
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def read_json(path: str) -> Any:
    """The parsed JSON file at `path`, or None when there is no such file."""
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None


def is_within(path: str, root: str) -> bool:
    """True when the real `path` lies inside the real `root` (symlinks resolved)."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def swap_into_place(new_dir: str, target: str) -> bool:
    """Put the directory `new_dir` at `target` atomically: readers see the old tree
    or the new one, never a mix or nothing. The old tree, if any, ends up at
    `new_dir` for the caller to remove. Uses renameat2(RENAME_EXCHANGE) (Linux)."""
    if not os.path.lexists(target):
        os.rename(new_dir, target)
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(new_dir), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), target)
    return True
