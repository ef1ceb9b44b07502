"""The shared sliding-window limiter against a real Redis: one count for every process,
the window sliding, and a Redis that fails leaving each process to count alone."""

import redis

from app.common import ratelimit, redis_client
from devtools.services import free_port
from devtools.waiting import wait_for


def test_two_processes_share_one_count(redis_server):
    client = redis_client.for_url(redis_server.new_url())
    first, second = (ratelimit.RedisRateLimiter(client, "test:login", 3, 60.0) for _ in range(2))
    assert [first.hit("ada"), second.hit("ada"), first.hit("ada")] == [None, None, None]
    assert 59 <= second.hit("ada") <= 60 and 59 <= first.hit("ada") <= 60
    assert first.hit("bo") is None  # another key, another count
    assert ratelimit.RedisRateLimiter(client, "test:other", 3, 60.0).hit("ada") is None  # another limit


def test_refused_attempts_do_not_count_and_the_window_slides(redis_server):
    client = redis_client.for_url(redis_server.new_url())
    limiter = ratelimit.RedisRateLimiter(client, "test:slide", 2, 1.0)
    assert [limiter.hit("k"), limiter.hit("k")] == [None, None]
    assert limiter.hit("k") == 1
    # Polled ten times a second: were refused attempts counted, the window would never free a place.
    wait_for(lambda: limiter.hit("k") is None, "the oldest attempt leaving the window", timeout=30)


def test_keys_are_hashed_and_expire_with_their_window(redis_server):
    client = redis_client.for_url(redis_server.new_url())
    ratelimit.RedisRateLimiter(client, "test:keys", 5, 60.0).hit("someone@example.com")
    [key] = client.keys("bundle:ratelimit:*")
    assert b"example.com" not in key and key.startswith(b"bundle:ratelimit:test:keys:")
    assert 0 < client.pttl(key) <= 60_000


def test_while_redis_fails_each_process_counts_alone(caplog):
    unreachable = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=2)
    limiter = ratelimit.RedisRateLimiter(unreachable, "test:down", 2, 60.0)
    assert [limiter.hit("k"), limiter.hit("k")] == [None, None]
    assert limiter.hit("k") is not None
    assert "counted in this process only" in caplog.text


def test_the_limiter_follows_redis_url(monkeypatch, redis_server):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert isinstance(ratelimit.limiter("test:choice", 3, 60.0), ratelimit.LocalRateLimiter)
    monkeypatch.setenv("REDIS_URL", redis_server.new_url())
    assert isinstance(ratelimit.limiter("test:choice", 3, 60.0), ratelimit.RedisRateLimiter)
