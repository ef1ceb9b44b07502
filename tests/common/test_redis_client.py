"""The process's Redis client: REDIS_URL read at first use, its mistakes named without
the password, and, under the gunicorn gevent worker, cooperative: a request waiting
on Redis leaves the worker free to answer the others."""

import os
import signal
import threading

import pytest

from app.common import redis_client
from app.common.config import ConfigError
from devtools.waiting import wait_for
from devtools.worker_sockets import tcp_sockets
from tests.support.wizard import TEST_IDENTITY, WizardClient


def test_unset_means_the_embedded_default(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "  ")
    assert redis_client.client() is None


@pytest.mark.parametrize("url", ["http://:hunter2@example.org/0", "redis://example.org:hunter2/0", "hunter2"])
def test_a_bad_url_is_named_without_its_password(url):
    with pytest.raises(ConfigError, match="REDIS_URL") as refused:
        redis_client.for_url(url)
    assert "hunter2" not in str(refused.value)


def test_keys_and_connection_names():
    assert redis_client.key("audio", "probe", "speech:espeak-ng") == "bundle:audio:probe:speech:espeak-ng"
    assert redis_client.connection_name("subscriber") == f"bundle-subscriber-{os.getpid()}"


def _unread_bytes_in(port):
    """Bytes that clients sent to the server on `port` and it has not read (Redis stopped)."""
    return sum(sock.rx_queue for sock in tcp_sockets() if sock.local_port == port)


def test_a_request_waiting_on_redis_leaves_the_worker_free(start_service, redis_server):
    """One worker. Redis is frozen (SIGSTOP): a write commits, then its PUBLISH waits for
    Redis, provably (its bytes sit unread in Redis's socket). Meanwhile the same worker
    answers other requests, a database read among them: the wait is gevent's, not the
    loop's. (The write would give up on Redis after its time-outs, some 15 s; the other
    requests must be answered before that, which they are within milliseconds.)"""
    service = start_service("wizard", env={**TEST_IDENTITY, "REDIS_URL": redis_server.new_url()})
    alice = WizardClient(service.base_url, "alice")
    outcome, done = {}, threading.Event()

    def write():
        outcome["status"] = (
            WizardClient(service.base_url, "alice")
            .post("/api/collections/saved_prompts", json={"text": "written while Redis is frozen"})
            .status_code
        )
        done.set()

    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        wait_for(lambda: _unread_bytes_in(redis_server.port) > 0, "the write waiting on Redis")
        assert alice.get("/healthz").status_code == 200
        texts = [row["text"] for row in alice.get("/api/collections/saved_prompts").json()]
        assert texts == ["written while Redis is frozen"]  # committed before its announcement
        assert not done.is_set(), "the write stopped waiting on Redis before the other requests were answered"
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    writer.join(60)
    assert outcome == {"status": 201}


def test_more_commands_at_once_than_the_pool_holds_wait_for_a_connection(redis_server):
    client = redis_client.for_url(redis_server.new_url())
    errors, done = [], []

    def one():
        try:
            done.append(client.blpop(["nothing-here"], timeout=0.2))  # holds its connection 0.2 s
        except Exception as exc:  # a refusal ("Too many connections") is what this test looks for
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2 * redis_client.POOL_SIZE + 20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and done == [None] * len(threads)
