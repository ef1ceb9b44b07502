"""REDIS_URL in its Sentinel form (app.common.redis_client): what it names, the pools
it makes (the process's keeps its bound of connections and its wait), and its
mistakes named without the password. Following the master across a failover, with
real sentinels, is tests/common/test_redis_failover.py."""

import pytest

from app.common import redis_client
from app.common.config import ConfigError

PASSWORD = "hunter2-secret"


def test_the_sentinels_the_master_set_and_the_database():
    parsed = redis_client.parse_sentinel_url(
        f"redis+sentinel://:{PASSWORD}@10.0.0.1:26379,data-2,[fd00::3]:26380/bundle/3"
    )
    assert parsed.sentinels == (("10.0.0.1", 26379), ("data-2", 26379), ("fd00::3", 26380))
    assert (parsed.master, parsed.db, parsed.username, parsed.password) == ("bundle", 3, None, PASSWORD)


def test_a_password_with_reserved_characters_is_percent_encoded():
    parsed = redis_client.parse_sentinel_url("redis+sentinel://app:p%40ss%3Aword@h1/bundle")
    assert (parsed.username, parsed.password, parsed.db) == ("app", "p@ss:word", 0)


@pytest.mark.parametrize(
    "url",
    [
        f"redis+sentinel://:{PASSWORD}@h1:port/bundle/0",  # a port that is no number
        f"redis+sentinel://:{PASSWORD}@h1:26379/",  # no master set
        f"redis+sentinel://:{PASSWORD}@h1:26379/bundle/one",  # a database that is no number
        f"redis+sentinel://:{PASSWORD}@/bundle/0",  # no sentinel
        f"redis+sentinel://:{PASSWORD}@h1,,h2/bundle/0",  # an empty one
    ],
)
def test_a_bad_sentinel_url_is_named_without_its_password(url):
    with pytest.raises(ConfigError, match="REDIS_URL") as refused:
        redis_client.for_url(url)
    assert PASSWORD not in str(refused.value)
    assert "redis+sentinel://" in str(refused.value)  # the form it must take


def test_the_process_pool_asks_the_sentinels_and_keeps_its_bounds():
    client = redis_client.for_url(f"redis+sentinel://:{PASSWORD}@127.0.0.1:1,127.0.0.1:2/bundle/5")
    pool = client.connection_pool
    assert isinstance(pool, redis_client.BlockingSentinelPool)
    assert (pool.max_connections, pool.timeout) == (redis_client.POOL_SIZE, redis_client.POOL_WAIT_SECONDS)
    assert pool.connection_class is redis_client.SentinelConnection
    assert redis_client.database_number(client) == 5
    assert pool.service_name == "bundle"


def test_no_sentinel_answering_is_a_connection_error_without_the_password():
    client = redis_client.for_url(f"redis+sentinel://:{PASSWORD}@127.0.0.1:1/bundle/0")
    with pytest.raises(redis_client.redis.ConnectionError) as failed:
        client.ping()
    assert "No master found for 'bundle'" in redis_client.describe(failed.value)
    assert PASSWORD not in str(failed.value)


def test_the_subscriber_connection_asks_the_sentinels_too():
    conn = redis_client.subscriber_connection(f"redis+sentinel://:{PASSWORD}@127.0.0.1:1/bundle/0")
    assert isinstance(conn, redis_client.SentinelConnection)
    with pytest.raises(redis_client.redis.ConnectionError):
        conn.connect()


def test_describe_url_names_where_without_the_password():
    described = redis_client.describe_url(f"redis+sentinel://:{PASSWORD}@h1:26379,h2:26379/bundle/2")
    assert described == "redis master set bundle (sentinels h1:26379,h2:26379) db 2"
    assert redis_client.describe_url(f"redis://:{PASSWORD}@data:6380/1") == "redis data:6380 db 1"
