"""The notebook's job queue on Redis with Sentinel, across a failover that loses what
asynchronous replication had not carried yet: a job is never lost and never run twice.

The master is cut from its replica (devtools.redis_sentinel's writes_lost_in_failover),
then killed, so what it acknowledged meanwhile is missing on the replica the sentinels
promote: the dequeue of job A (run to its end meanwhile) and the enqueue of job B.
On the new master A is queued again: the worker takes it and skips it (its claim
finds the command no longer `new`). B's entry is gone: the command stays `new` in the
database, the truth, and the worker's periodic sweep queues it again (a `new` command
older than a sweep's period that the queue does not hold); it runs once. Each job
fetches a page of the link server, which counts the fetches: one each."""

import signal
import uuid

import pytest

from devtools.redis_sentinel import SentinelSet
from devtools.waiting import wait_for
from tests.notebook.test_queue_on_redis import Stack
from tests.support.notebook import PROVIDER_HOST, notebook_env

DB = 1


@pytest.fixture
def sentinel_stack(tmp_path, postgres_server, link_server):
    with SentinelSet(replicas=1) as redis_set:
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        env = notebook_env(
            data_dir,
            DATABASE_URL=postgres_server.new_database(),
            REDIS_URL=redis_set.url(DB),
            NOTEBOOK_EMBEDDING_PROVIDER="none",
            NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
        )
        stack = Stack(data_dir, env, link_server)
        stack.redis_set = redis_set
        try:
            yield stack
        finally:
            stack.close()


def _queue_length(node):
    """Entries in huey's queue list on `node` (a Redis server of the set)."""
    with node.client() as admin:
        admin.execute_command("SELECT", DB)
        return sum(admin.llen(key) for key in admin.keys("huey.redis.*"))


def _no_blocked_pop(node):
    """No BRPOP waits on `node`: a frozen worker's last ones timed out (a second each),
    so an entry queued now stays queued."""
    with node.client() as admin:
        return int(admin.info("clients")["blocked_clients"]) == 0


def _frozen(worker, node):
    worker.process.send_signal(signal.SIGSTOP)
    wait_for(lambda: _no_blocked_pop(node), "the frozen worker's waits on the queue timed out")


def test_a_failover_loses_an_enqueue_and_undoes_a_dequeue_and_each_job_runs_once(sentinel_stack):
    stack, redis_set, tag = sentinel_stack, sentinel_stack.redis_set, uuid.uuid4().hex
    nb, hits = stack.client, stack.links.state["hits"]
    worker = stack.add_worker()
    notebook = nb.notebook()
    replica = redis_set.replicas()[0]

    _frozen(worker, redis_set.master())
    job_a = stack.add_link(notebook, f"/page/{tag}-a")
    wait_for(lambda: _queue_length(replica) == 1, "job A's entry replicated")
    with redis_set.writes_lost_in_failover() as old_master:
        worker.process.send_signal(signal.SIGCONT)
        assert nb.wait_command(job_a["command_id"])["status"] == "completed"  # its dequeue stays on the old master
        _frozen(worker, old_master)
        job_b = stack.add_link(notebook, f"/page/{tag}-b")  # its enqueue stays on the old master
        assert _queue_length(old_master) == 1 and _queue_length(replica) == 1  # A's entry there, not B's
    redis_set.wait_for_failover(("127.0.0.1", old_master.port))
    assert _queue_length(replica) == 1  # the new master: A's entry back, B's lost
    worker.process.send_signal(signal.SIGCONT)

    key_a = job_a["command_id"].split(":")[1]
    wait_for(lambda: f"command {key_a} skipped" in worker.log_text(), "A's copy skipped", timeout=60)
    assert nb.wait_command(job_b["command_id"], deadline=60)["status"] == "completed"
    assert "were missing from the queue" in worker.log_text()
    assert (hits.get(f"/page/{tag}-a"), hits.get(f"/page/{tag}-b")) == (1, 1)
    assert _queue_length(replica) == 0 and worker.process.poll() is None
    # The web worker follows the new master too: a job queued now runs at once.
    job_c = stack.add_link(notebook, f"/page/{tag}-c")
    assert nb.wait_command(job_c["command_id"])["status"] == "completed"
