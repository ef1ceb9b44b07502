"""Uploaded files under DATA_DIR/uploads: names reduced to a safe basename and
made unique, written without ever leaving that folder."""

import os
import re
import shutil
import unicodedata

from app.common.failures import Conflict, Invalid, TooLarge
from app.common.fsutil import fsync_dir, is_within

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_NAME = 120


def safe_name(filename):
    """A basename of letters, digits, dots, dashes and underscores: no directory
    part (either slash), no leading dot, nothing a shell or a path would read
    specially. Never empty."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    name = _UNSAFE.sub("_", name).strip("._-")
    name = re.sub(r"\.{2,}", ".", name)
    if not name:
        name = "upload"
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    ext = ext[:16]
    stem = stem[: MAX_NAME - len(ext) - 1] or "upload"
    return f"{stem}.{ext}" if ext else stem


def _candidates(name):
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    yield name
    for n in range(1, 10_000):
        yield f"{stem}-{n}.{ext}" if ext else f"{stem}-{n}"


def store(stream, filename, uploads_dir, max_bytes):
    """Copy `stream` into a new file of `uploads_dir` named after `filename` (made
    safe, de-duplicated with -1, -2, …). Returns (stored basename, size). Runs in the
    threadpool: it writes up to the upload cap."""
    os.makedirs(uploads_dir, exist_ok=True)
    for candidate in _candidates(safe_name(filename)):
        path = os.path.join(uploads_dir, candidate)
        if not is_within(path, uploads_dir):  # cannot happen with a safe name; kept as the last word
            raise Invalid("file: invalid file name", field="file")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(stream, out, 1024 * 1024)
                size = out.tell()
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            os.unlink(path)
            raise
        if size > max_bytes:
            os.unlink(path)
            raise TooLarge(f"file: the upload is larger than {max_bytes} bytes", field="file")
        fsync_dir(uploads_dir)
        return candidate, size
    raise Conflict(f"file: too many files named {filename!r}")


def path_of(uploads_dir, stored_name):
    path = os.path.join(uploads_dir, stored_name)
    return path if is_within(path, uploads_dir) else None
