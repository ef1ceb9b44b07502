"""The Redis backend of the broker against a real Redis server: one order for every
process, laggards dropped, a lost connection closing the subscriptions and coming
back, an unreachable Redis refusing subscriptions and never failing a publish.

Each scenario runs in a child Python with gevent's monkey patch, as in a gunicorn
worker (the broker's reader is a greenlet on gevent's sockets, and wait_for's sleep
is gevent's); two RedisBroker objects in it stand for two worker processes. The scenarios are the functions below
whose names start with `scenario_`; the tests run them."""

import subprocess
import sys

import gevent
import pytest
import redis

from app.common.broker import LocalBroker, ProcessBroker, RedisBroker, SubscriptionClosed
from app.common.redis_client import connection_name
from devtools.services import ROOT, free_port
from devtools.waiting import wait_for


def run_patched(scenario, *args):
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        f"from tests.common.test_redis_broker import {scenario}\n"
        f"{scenario}(*{args!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def test_every_process_hears_every_publish_in_one_order(redis_server):
    run_patched("scenario_one_order", redis_server.new_url())


def test_a_laggard_is_dropped_and_the_others_go_on(redis_server):
    run_patched("scenario_laggard", redis_server.new_url())


def test_a_lost_connection_closes_the_subscriptions_then_comes_back(redis_server):
    log = run_patched("scenario_connection_lost", redis_server.new_url(), redis_server.url())
    assert "the connection to Redis is lost" in log
    assert redis_server.password not in log


def test_an_unreachable_redis_refuses_subscriptions_and_never_fails_a_publish():
    log = run_patched("scenario_unreachable", f"redis://:secret-password@127.0.0.1:{free_port()}/0")
    assert "was not published" in log and "secret-password" not in log


def test_close_all_ends_the_subscriptions_and_the_reader(redis_server):
    run_patched("scenario_close_all", redis_server.new_url())


def test_the_process_broker_is_chosen_by_redis_url_at_first_use(monkeypatch, redis_server):
    monkeypatch.delenv("REDIS_URL", raising=False)
    embedded = ProcessBroker()
    assert isinstance(embedded.backend(), LocalBroker) and not embedded.shared
    monkeypatch.setenv("REDIS_URL", redis_server.new_url())
    assert isinstance(embedded.backend(), LocalBroker)  # chosen once, at first use
    shared = ProcessBroker()
    assert isinstance(shared.backend(), RedisBroker) and shared.shared


def test_a_process_broker_closed_before_its_first_use_stays_closed(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    stopping = ProcessBroker()
    stopping.close_all("server is stopping")
    with pytest.raises(SubscriptionClosed, match="stopping"):
        stopping.subscribe("t").get(timeout=5)


# --------------------------------------------------------------------------- scenarios (in the child)


def scenario_one_order(url):
    first, second = RedisBroker(url), RedisBroker(url)
    subs = [first.subscribe("t"), first.subscribe("t"), second.subscribe("t")]
    elsewhere = second.subscribe("u")
    assert (first.subscriber_count("t"), second.subscriber_count("t")) == (2, 1)  # each process its own

    def publish(broker, name):
        for n in range(50):
            broker.publish("t", {"from": name, "n": n})
            gevent.sleep(0)

    gevent.joinall([gevent.spawn(publish, first, "first"), gevent.spawn(publish, second, "second")], raise_error=True)
    heard = [[sub.get(10) for _ in range(100)] for sub in subs]
    assert heard[0] == heard[1] == heard[2], "the processes heard different orders"
    for name in ("first", "second"):
        assert [m["n"] for m in heard[0] if m["from"] == name] == list(range(50))
    second.publish("u", "marker")
    assert elsewhere.get(10) == "marker"  # and nothing of "t" before it
    for sub in subs:
        assert sub.get(timeout=0.01) is None  # each heard every message once
        sub.close()
    # The last local subscriber gone, the process no longer listens to the topic.
    channel = first._prefix + "t"
    wait_for(lambda: first._client.pubsub_numsub(channel) == [(channel.encode(), 0)], "the UNSUBSCRIBEs", 10)


def scenario_laggard(url):
    listener, publisher = RedisBroker(url, max_pending=5), RedisBroker(url)
    slow, fast = listener.subscribe("t"), listener.subscribe("t")
    for n in range(10):
        publisher.publish("t", n)
        assert fast.get(10) == n
    assert [slow.get(0) for _ in range(5)] == [0, 1, 2, 3, 4]
    try:
        slow.get(0)
        raise AssertionError("the laggard was not dropped")
    except SubscriptionClosed as closed:
        assert "lagging" in closed.reason
    assert listener.subscriber_count("t") == 1
    publisher.publish("t", "still here")
    assert fast.get(10) == "still here"


def scenario_connection_lost(url, admin_url):
    listener, publisher = RedisBroker(url), RedisBroker(url)
    sub = listener.subscribe("t")
    waiting = gevent.spawn(sub.get, 30)
    gevent.sleep(0)
    admin = redis.Redis.from_url(admin_url)
    mine = [c["id"] for c in admin.client_list() if c["name"] == connection_name("subscriber")]
    assert len(mine) == 1, "one subscriber connection per process"
    admin.client_kill_filter(_id=mine[0])
    try:
        waiting.get(timeout=10)
        raise AssertionError("the subscription outlived its connection")
    except SubscriptionClosed as closed:
        assert closed.reason.startswith("live events were interrupted")
    assert listener.subscriber_count("t") == 0
    again = _subscribe_once_back(listener, "t")
    publisher.publish("t", "after")
    assert again.get(10) == "after"


def _subscribe_once_back(broker, topic):
    """The reader reconnects with backoff; until then subscriptions are closed at once."""

    def attempt():
        sub = broker.subscribe(topic)
        assert sub.closed_reason is None or sub.closed_reason.startswith("live events are unavailable")
        return sub if sub.closed_reason is None else None

    return wait_for(attempt, "the reconnection", 30)


def scenario_unreachable(url):
    broker = RedisBroker(url)
    sub = broker.subscribe("t")
    assert sub.closed_reason.startswith("live events are unavailable") and "secret" not in sub.closed_reason
    broker.publish("t", {"n": 1})  # logged, not raised
    later = broker.subscribe("t")
    assert later.closed_reason.startswith("live events are unavailable")
    assert broker.subscriber_count("t") == 0


def scenario_close_all(url):
    broker = RedisBroker(url)
    sub = broker.subscribe("t")
    waiting = gevent.spawn(sub.get, 30)
    gevent.sleep(0)
    broker.close_all("server is stopping")
    try:
        waiting.get(timeout=5)
        raise AssertionError("close_all left a subscription open")
    except SubscriptionClosed as closed:
        assert "stopping" in closed.reason
    assert broker.subscribe("t").closed_reason == "server is stopping"
    broker._reader.join(timeout=5)
    assert broker._reader.dead
