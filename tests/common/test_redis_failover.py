"""The services on Redis with Sentinel (REDIS_URL `redis+sentinel://...`), across a
failover, without a restart: one set of a master, two replicas and three real
sentinels for the module (devtools.redis_sentinel), failed over once per test.

- The master killed: the rate limits count on the new master, with what was counted
  before (replicated), and the probes' lock and shared result work there; a change
  counter reads differently after the failover (its last bumps may be lost: caches
  compute again).
- The master frozen (a host gone without FIN or RST): /readyz is ready again once
  the sentinels promoted a replica, before the old master is back; the wizard's live streams on
  two gunicorn gevent workers end ("live events were interrupted") once the old
  master, back, is demoted (the sentinels close its clients); a write made during the
  failover commits and answers, but its announcement is lost to the streams that were
  subscribed on the old master (pub/sub keeps nothing): the reopened streams and the
  collection's read, which a client makes when its stream reconnects, have it; the
  next write reaches every stream of both workers, once. (The old master rejoining as
  a replica by itself is devtools.redis_sentinel's wait_for_replica; left out here: it
  waits some 10 s for the sentinels' next look at it.)

The notebook's job queue across a failover is tests/notebook/test_queue_failover.py."""

import uuid

import pytest
import requests

from app.audio.probes import SharedProbe
from app.common import ratelimit, redis_client
from app.common.change_counter import RedisChangeCounter
from devtools.redis_sentinel import SentinelSet
from devtools.waiting import wait_for
from tests.audio.test_probes_shared import Engine, FakeClock
from tests.support.wizard import TEST_IDENTITY, WizardClient
from tests.wizard.test_scale_out import Stream, close_all, on_every_worker, post_prompt


@pytest.fixture(scope="module")
def sentinel_set():
    with SentinelSet(replicas=2) as redis_set:
        yield redis_set


def _readiness(service):
    """/readyz's status and its Redis check."""
    answer = requests.get(service.base_url + "/readyz", timeout=30)
    return answer.status_code, answer.json()["checks"].get("redis")


def subscribed_pids(sentinel_set, db):
    """The pids of the processes with a subscriber connection to database `db` of the
    current master (connections are named bundle-<role>-<pid>)."""
    with sentinel_set.master().client() as admin:
        listed = admin.client_list()
    return {
        int(c["name"].rsplit("-", 1)[1])
        for c in listed
        if c.get("name", "").startswith("bundle-subscriber-") and c.get("db") == str(db)
    }


def test_rate_limits_and_locks_work_on_the_new_master_after_the_master_is_killed(sentinel_set, caplog):
    client = redis_client.for_url(sentinel_set.url(db=1))
    name = f"test:{uuid.uuid4().hex}"
    first, second = (ratelimit.RedisRateLimiter(client, name, 3, 60.0) for _ in range(2))
    assert [first.hit("ada"), second.hit("ada")] == [None, None]
    counter = RedisChangeCounter(client, f"bundle:test:generation:{uuid.uuid4().hex}")
    counter.bump()
    before = counter.current()
    assert client.wait(2, 5000) == 2  # the count is on both replicas (replication is asynchronous)

    sentinel_set.wait_for_failover(sentinel_set.kill_master())
    # The stored value is the same (replicated), but a bump the failover lost would have
    # brought it back to what a cache holds: the value read after a failover differs.
    after = counter.current()
    assert after != before and int(client.get(counter.key)) == 1
    assert counter.current() == after  # and stays, until the next bump
    # The same client, no restart: its connections to the dead master fail, and the
    # retry asks the sentinels for the new one.
    assert first.hit("ada") is None  # the third of three, counted with the two before
    assert second.hit("ada") is not None  # refused: one count of three on the new master
    assert "counted in this process only" not in caplog.text
    clock = FakeClock()
    engine = Engine()
    probe_name = f"speech:{uuid.uuid4().hex}"
    probes = [SharedProbe(engine.check, 10, 1, client, probe_name, clock=clock) for _ in range(2)]
    assert probes[0].state().available and probes[1].state().available
    assert engine.calls == 1  # one took the lock and probed; the other read its result


def test_wizard_streams_resync_across_a_frozen_master(sentinel_set, start_service):
    url = sentinel_set.url(db=2)
    service = start_service("wizard", workers=2, env={**TEST_IDENTITY, "REDIS_URL": url})
    reader, alice = WizardClient(service.base_url, "reader"), WizardClient(service.base_url, "alice")
    streams = on_every_worker(service, lambda: Stream(reader, "/api/events"))
    try:
        assert _readiness(service) == (200, "ok")
        with sentinel_set.frozen_master() as old:
            sentinel_set.wait_for_failover(old)
            # /readyz pings Redis through the same client: ready again on the new master.
            wait_for(lambda: _readiness(service) == (200, "ok"), "/readyz ready on the new master")
            # Its announcement goes to the new master; the streams listen on the frozen one.
            during = alice.post("/api/collections/saved_prompts", json={"text": "during the failover"})
            assert during.status_code == 201, during.text
        for stream in streams:
            assert stream.ending().startswith("closed: live events were interrupted")  # never a silent gap
        # Each worker's subscriber reconnects (to the master the sentinels name) by itself.
        pids = set(service.worker_pids())
        wait_for(lambda: subscribed_pids(sentinel_set, 2) == pids, "both workers subscribed on the new master")
        streams = on_every_worker(service, lambda: Stream(reader, "/api/events"))
        texts = [row["text"] for row in alice.get("/api/collections/saved_prompts").json()]
        assert texts.count("during the failover") == 1  # what the reconnected client reads
        post_prompt(alice, "after the failover").close()
        for stream in streams:
            assert stream.next(1) == [{"collection": "saved_prompts"}]
    finally:
        close_all(streams)
