"""Engine subprocesses: early exits, caps and deadlines."""

import pytest

from app.audio.process import run_engine
from app.audio.providers import TooLarge


def test_an_engine_that_exits_without_reading_its_input_reports_its_own_failure():
    for size in (10, 1024 * 1024):  # in the pipe's buffer, and far past it
        code, output, error = run_engine(["sh", "-c", "echo refused >&2; exit 3"], b"x" * size, 10, 1024, "engine")
        assert (code, output, error) == (3, b"", "refused")


def test_output_past_the_cap_and_an_engine_that_cannot_start():
    # (The deadline needs gevent's patched subprocess: see test_probes' slow engine, through gunicorn.)
    with pytest.raises(TooLarge, match="larger than the limit of 1000 bytes"):
        run_engine(["sh", "-c", "head -c 5000 /dev/zero"], None, 10, 1000, "engine")
    with pytest.raises(OSError):
        run_engine(["/nonexistent/engine"], b"x", 1, 1000, "engine")
