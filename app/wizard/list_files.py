"""Collection lists that nginx sends itself.

A list runs to hundreds of kilobytes and every open page fetches it again after each
event of its collection. When nginx says it can (the `X-Wiz-Accel-Lists` header, set by
the site when it serves `$DATA_DIR/lists`), the worker still does everything that
decides the answer (identity, scope, the collection's version, the content tag), then
writes the body once to `<lists>/<tag>.json` and answers with an `X-Accel-Redirect`
there: nginx sends the file as it sends a static one (sendfile, no copy through the
worker). Without the header the worker sends the body itself, as before.

A file is named by the tag of its content, so every worker and every request for the
same bytes shares it, and a name never points at other bytes. Files not written for
STALE_SECONDS are removed now and then; one removed while a request was about to be
sent it is answered by the worker instead (the site's fallback), never a 404.
"""

import os
import tempfile
import time

from flask import Response, current_app

ACCEL_HEADER = "X-Wiz-Accel-Lists"
INTERNAL_PREFIX = "/_wizard_lists/"
STALE_SECONDS = 600
PRUNE_EVERY = 64  # new files between two sweeps of the folder

_written_since_prune = 0


def folder():
    return current_app.config["WIZARD"].lists_dir


def redirect_response(answer):
    """An empty answer sending nginx to the file of `answer` (a cache.Answer)."""
    path = os.path.join(folder(), answer.tag + ".json")
    if not os.path.exists(path):
        _write(path, answer.body)
    response = Response(b"", mimetype="application/json")
    response.headers["X-Accel-Redirect"] = INTERNAL_PREFIX + answer.tag + ".json"
    return response


def write_whole(path, data, mtime=None):
    """A file nginx may open at any moment (another worker may send this name): whole
    or absent, readable by nginx's workers; its modification time `mtime` if given.
    Not synced to disk: a file lost in a crash is written again when next asked for."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, 0o644)
        if mtime is not None:
            os.utime(temporary, (mtime, mtime))
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _write(path, body):
    global _written_since_prune
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    write_whole(path, body)
    _written_since_prune += 1
    if _written_since_prune >= PRUNE_EVERY:
        _written_since_prune = 0
        prune(directory)


def prune(directory, now=None):
    """Remove the files not written for STALE_SECONDS (a current one is written again
    when next asked for: its name is its content)."""
    limit = (now or time.time()) - STALE_SECONDS
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                if entry.is_file() and entry.stat().st_mtime < limit:
                    os.unlink(entry.path)
            except FileNotFoundError:  # another worker removed it first
                pass
