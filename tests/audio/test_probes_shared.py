"""Probes shared through Redis (REDIS_URL): one probe per interval for the whole
deployment. A short Redis lock decides which process probes; the others read its
result, stored with its time."""

import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gevent
import redis
import requests

from app.audio.probes import SharedProbe
from app.common import redis_client
from devtools.services import GUNICORN, ROOT, free_port
from devtools.waiting import wait_for
from tests.support.audio import start_audio

WORKERS = 4


class FakeClock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


class Engine:
    """A provider's probe that counts its calls."""

    def __init__(self):
        self.calls = 0

    def check(self):
        self.calls += 1


def shared_pair(redis_server, clock, interval=10):
    """Two probes of one provider, as two processes of one deployment hold them."""
    client = redis_client.for_url(redis_server.new_url())
    engine = Engine()
    return engine, [SharedProbe(engine.check, interval, 1, client, "speech:test", clock=clock) for _ in range(2)]


def test_one_process_probes_and_the_other_reads_its_result(redis_server):
    clock = FakeClock()
    engine, (first, second) = shared_pair(redis_server, clock)
    assert first.state().available and engine.calls == 1
    assert second.state().available and engine.calls == 1  # read, not probed
    clock.now += 10  # past the interval, for both
    second.state()  # answered at once, refreshed behind
    second._prober.join(timeout=10)
    assert engine.calls == 2
    first.state()
    first._prober.join(timeout=10)
    assert engine.calls == 2  # the fresh result was there to read
    assert first.state().checked_at == second.state().checked_at == clock.now


def test_while_another_process_holds_the_lock_its_result_is_awaited(redis_server):
    clock = FakeClock()
    engine, (probe, _) = shared_pair(redis_server, clock)
    client = probe._client
    client.set(probe._lock_key, "another process", px=60_000)
    waiting = gevent.spawn(probe.state)
    # Runs until its first yield: its Redis calls do not yield here (no monkey patch in
    # pytest), so that is the pause between two looks for the lock holder's result.
    gevent.sleep(0)
    client.set(
        probe._result_key, json.dumps({"available": False, "reason": "no sound folder", "checked_at": clock.now})
    )
    result = waiting.get(timeout=10)
    assert (result.available, result.reason, engine.calls) == (False, "no sound folder", 0)


def test_without_redis_each_process_probes_for_itself(caplog):
    engine = Engine()
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=2)
    probe = SharedProbe(engine.check, 10, 1, client, "speech:test")
    assert probe.state().available and engine.calls == 1
    assert "runs in this process only" in caplog.text


def _pids_with_redis(redis_server, url):
    """The pids of the processes connected to the database of `url` (connections are
    named bundle-<role>-<pid>)."""
    db = url.rsplit("/", 1)[1]
    return {
        int(c["name"].rsplit("-", 1)[1])
        for c in redis.Redis.from_url(redis_server.url()).client_list()
        if c.get("name", "").startswith("bundle-") and c.get("db") == db
    }


def test_a_flood_on_four_workers_costs_one_probe_per_interval(start_service, tmp_path, redis_server):
    """Probes are at least an interval apart, whichever worker runs them: over a span
    of T seconds there are at most T / interval + 1 (unshared, each of the four workers
    would probe at its start already)."""
    interval, url = 2.0, redis_server.new_url()
    started = time.monotonic()
    audio = start_audio(
        lambda name, **kwargs: start_service(name, workers=WORKERS, **kwargs),
        tmp_path,
        {"AUDIO_PROBE_INTERVAL": str(interval), "REDIS_URL": url},
    )
    pids = wait_for(
        lambda: len(audio.service.worker_pids()) == WORKERS and set(audio.service.worker_pids()), f"{WORKERS} workers"
    )
    # Each worker's start-up probe went through Redis.
    wait_for(lambda: _pids_with_redis(redis_server, url) >= pids, "every worker's start-up probe")
    stop, statuses = threading.Event(), []

    def flood():
        while not stop.is_set():
            statuses.append(requests.get(audio.url + "/ready", timeout=30).status_code)

    with ThreadPoolExecutor(8) as pool:
        floods = [pool.submit(flood) for _ in range(8)]
        try:
            wait_for(lambda: audio.probes_run() >= 3, "two refreshes during the flood")
        finally:
            stop.set()
        for running in floods:
            running.result()
    probes, span = audio.probes_run(), time.monotonic() - started
    assert set(statuses) == {200} and len(statuses) > 10
    assert probes <= span / interval + 1, (probes, span)


def test_a_bad_redis_url_stops_the_start_with_one_line_naming_it(tmp_path):
    env = {
        **os.environ,
        "SERVICE": "audio",
        "HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "DATA_DIR": str(tmp_path),
        "REDIS_URL": "http://:hunter2@example.org/0",
    }
    done = subprocess.run(
        [str(GUNICORN), "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "REDIS_URL" in errors[0], done.stderr
    assert "hunter2" not in done.stderr
