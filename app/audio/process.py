"""Running an engine subprocess cooperatively: input on stdin, output read within
a byte cap and a deadline, the process killed whatever happens."""

import subprocess
from functools import partial

import gevent

from app.audio.providers import read_capped


class EngineTimeout(Exception):
    pass


def run_engine(argv, stdin, timeout, limit, what, cwd=None):
    """(exit code, stdout bytes, first stderr line) of `argv`. Raises OSError when
    it cannot be started, EngineTimeout past `timeout`, TooLarge past `limit` bytes."""
    process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with gevent.Timeout(timeout, EngineTimeout(f"{what} took more than {timeout:g} s")):
            try:
                if stdin is not None:
                    process.stdin.write(stdin)
                process.stdin.close()
            except BrokenPipeError:
                pass  # it exited without reading its input: its exit code and stderr say why
            output = read_capped(iter(partial(process.stdout.read, 65536), b""), limit, f"{what}'s answer")
            error = process.stderr.read(4096).decode(errors="replace").strip().splitlines()
            code = process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            try:
                stream.close()
            except BrokenPipeError:
                pass  # input it never read
    return code, output, (error[0][:300] if error else "")
