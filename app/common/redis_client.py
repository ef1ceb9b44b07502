"""The process's Redis client, from `REDIS_URL`, for the state that several workers
or hosts of a service share (live events, rate limits, probe results).

`REDIS_URL` is what redis-py's `from_url` accepts: `redis://[:password@]host:port/db`,
`rediss://...` (TLS) or `unix:///path/to/redis.sock?db=N`. Unset or blank means the
embedded default: every such state stays in the process, as on a one-worker host.

The client is made at first use, not at import: the gunicorn worker monkey-patches
before the app is imported, and redis-py then makes gevent's cooperative sockets, so
a Redis call waits without blocking the worker's loop. The URL carries a password:
it is never logged nor put in an error.
"""

import os
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import ConnectionInterface
from redis.retry import Retry

from app.common.config import ConfigError, env_str

# A Redis that does not accept a connection within this is down: say so, do not hang.
CONNECT_TIMEOUT = 2.0
# The bound on one command. Every command of the bundle is small and quick.
COMMAND_TIMEOUT = 5.0
# Every key and channel of the bundle starts with this.
PREFIX = "bundle"
SCHEMES = ("redis://", "rediss://", "unix://")
T = TypeVar("T")

# Connections of a process's pool, and how long a command waits for one of them.
POOL_SIZE = 64
POOL_WAIT_SECONDS = 5.0
_clients: dict[str, redis.Redis] = {}  # URL -> its client (tests change the environment between apps)


def configured_url() -> str:
    """REDIS_URL, or "" when the embedded default is wanted."""
    return env_str("REDIS_URL")


def client() -> redis.Redis | None:
    """The process's client, or None when REDIS_URL is unset. ConfigError names
    REDIS_URL when it is not a Redis URL."""
    url = configured_url()
    return for_url(url) if url else None


def for_url(url: str) -> redis.Redis:
    """The process's client of `url` (one connection pool per URL)."""
    if url not in _clients:
        # A retry on a fresh connection absorbs a pooled connection that a Redis
        # restart cut; more would only hold a request while Redis is down.
        # Past POOL_SIZE commands at once a command waits for a connection (up to
        # POOL_WAIT_SECONDS) rather than failing ("Too many connections", redis-py's
        # default pool past 100): a worker stopping with 5,000 agents releases 5,000
        # entries at once.
        pool = _from_url(
            redis.BlockingConnectionPool.from_url,
            url,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 2),
            health_check_interval=30,
            client_name=connection_name("process"),
            max_connections=POOL_SIZE,
            timeout=POOL_WAIT_SECONDS,
        )
        _clients[url] = redis.Redis(connection_pool=pool)
        _clients[url].auto_close_connection_pool = True
    return _clients[url]


def subscriber_connection(url: str) -> ConnectionInterface:
    """A connection of its own (no pool shares it) that is never retried behind its
    owner's back: the broker's subscriber connection, whose owner must know each time
    it is lost, since its subscriptions are lost with it. Not connected yet."""
    # RESP2: published messages are plain replies, read in turn (RESP3 would hand them
    # to redis-py's push handler instead of to the reader).
    pool = _from_url(
        redis.ConnectionPool.from_url,
        url,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
        client_name=connection_name("subscriber"),
    )
    return pool.make_connection()


def connection_name(role: str) -> str:
    """The name its connections give Redis (CLIENT LIST shows it): `bundle-<role>-<pid>`,
    so an operator, or a test, sees which process holds which connection."""
    return f"{PREFIX}-{role}-{os.getpid()}"


def database_number(shared_client: redis.Redis) -> int:
    """The database number of the client's URL (0 when it names none)."""
    return int(shared_client.connection_pool.connection_kwargs.get("db") or 0)


def describe(exc: BaseException) -> str:
    """A Redis error (or a database driver's: readiness) in a few words for a log line
    or an answer: its first line, never the URL (it carries the password)."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def key(*parts: object) -> str:
    """A key of the bundle: `bundle:<part>:<part>...`."""
    return ":".join((PREFIX, *(str(p) for p in parts)))


def _from_url(from_url: Callable[..., T], url: str, **options: Any) -> T:
    # redis-py's own message may quote a part of the URL, the password perhaps: not shown.
    if not url.startswith(SCHEMES):
        raise ConfigError(f"REDIS_URL must start with one of {', '.join(SCHEMES)}")
    try:
        return from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=COMMAND_TIMEOUT, **options)
    except ValueError:
        raise ConfigError(
            "REDIS_URL is not a valid Redis URL (redis://[:password@]host:port/db, rediss://..."
            " or unix:///path/to/socket?db=N)"
        ) from None
