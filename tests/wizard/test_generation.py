"""The generation layer (app/wizard/generation.py) under gevent's patching, as in the
gunicorn worker, in a process of its own. The layer in plain threads is
tests/unit/wizard/test_generation.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.fake_providers import FakeProviders

KEY = "sk-test-0123456789abcdef"
SLOW = 0.4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake():
    with FakeProviders(host="127.0.0.1", keys={"openai": KEY}, slow=SLOW) as server:
        yield server


GEVENT_SCRIPT = """
from gevent import monkey; monkey.patch_all()
import json, sys, gevent, gevent.lock
from app.wizard.generation import Generator
base, key, slow = sys.argv[1], sys.argv[2], float(sys.argv[3])
gen = Generator(base_url=base, api_key=key, text_model="fake-slow", image_model="fake-png",
                timeout=5, concurrency=1)
ticks = []
def tick():
    while True:
        ticks.append(1)
        gevent.sleep(0.02)
ticker = gevent.spawn(tick)
chunks = []
calls = [gevent.spawn(gen.text, [{"role": "user", "content": "hi"}], json_mode=True),
         gevent.spawn(gen.text, [{"role": "user", "content": "hi"}], json_mode=True,
                      on_chunk=chunks.append),
         gevent.spawn(gen.image, "a cat", "4:3")]
gevent.joinall(calls, raise_error=True)
ticker.kill()
from app.wizard.generation import GenerationFailed
quick = Generator(base_url=base, api_key=key, text_model="fake-slow", image_model="", timeout=0.15)
try:
    quick.text([{"role": "user", "content": "hi"}], json_mode=True)
    timed_out = None
except GenerationFailed as exc:
    timed_out = exc.status
texts = sorted((c.value.timing for c in calls[:2]), key=lambda t: t["queueMs"])
print(json.dumps({"queue": [t["queueMs"] for t in texts], "ticks": len(ticks),
                  "chunks": "".join(chunks), "timed_out": timed_out, "webp": calls[2].value.webp[8:12].decode(),
                  "gevent_slots": isinstance(gen._slots, gevent.lock.BoundedSemaphore)}))
"""


def test_works_under_gevent_patching(fake):
    run = subprocess.run(
        [sys.executable, "-c", GEVENT_SCRIPT, fake.base_url(), KEY, str(SLOW)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["gevent_slots"] is True
    assert result["queue"][0] < 100 and result["queue"][1] >= SLOW * 1000 * 0.8
    # the loop kept running while the calls waited on the provider and on each other
    assert result["ticks"] >= (2 * SLOW) / 0.02 * 0.5
    assert json.loads(result["chunks"]) == {"slow": True}
    assert result["webp"] == "WEBP"
    assert result["timed_out"] == 504
