"""The shared provider transport (app/common/provider_http.py) under gevent's patching,
in a process of its own: the head's deadline holds. The transport in plain threads is
tests/unit/common/test_provider_http.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.provider_http import FakeProvider

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake():
    with FakeProvider() as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(fake):
    fake.seen.clear()
    fake.release.clear()
    yield
    fake.release.set()  # a held answer ends with the test


GEVENT_SCRIPT = """
from gevent import monkey; monkey.patch_all()
import sys, gevent
from app.common.provider_http import Deadline, Exchange, ProviderFailed, Wording
base = sys.argv[1]
def held():
    try:
        Exchange(Wording("Fake"), Deadline(0.3), base, 1.0).open("GET", base + "/hold-head", {})
    except ProviderFailed as exc:
        return exc.status
calls = [gevent.spawn(held) for _ in range(3)]
gevent.joinall(calls, raise_error=True)  # held together: none blocks the loop for the others
with Exchange(Wording("Fake"), Deadline(5.0), base, 1.0).open("GET", base + "/json", {}) as ex:
    answer = ex.json()
print([c.value for c in calls], answer)
"""


def test_under_gevent_the_head_is_bounded(fake):
    run = subprocess.run(
        [sys.executable, "-c", GEVENT_SCRIPT, fake.base],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[504, 504, 504] {'ok': True}"
