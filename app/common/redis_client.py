"""The process's Redis client, from `REDIS_URL`, for the state that several workers
or hosts of a service share (live events, rate limits, probe results).

`REDIS_URL` is what redis-py's `from_url` accepts: `redis://[:password@]host:port/db`,
`rediss://...` (TLS) or `unix:///path/to/redis.sock?db=N`; or, for Redis with Sentinel,
`redis+sentinel://[:password@]host:port,host:port,.../<master name>/<db>`, which names
the sentinels (port 26379 unless given) and the master set they watch (see
SentinelURL). Unset or blank means the embedded default: every such state stays in the
process, as on a one-worker host.

With Sentinel, each new connection asks the sentinels where the master is, and a
connection that fails (the master is gone, or answers READONLY since it was demoted)
is dropped: the retry, or the next command, connects to the master the sentinels name
then. So every user of this module follows the master after a failover without a
restart; what a failover loses is stated in docs/scaling.md.

The client is made at first use, not at import: the gunicorn worker monkey-patches
before the app is imported, and redis-py then makes gevent's cooperative sockets, so
a Redis call waits without blocking the worker's loop. The URL carries a password:
it is never logged nor put in an error.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import ConnectionInterface
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from app.common.config import ConfigError, env_str

# A Redis that does not accept a connection within this is down: say so, do not hang.
CONNECT_TIMEOUT = 2.0
# The bound on one command. Every command of the bundle is small and quick.
COMMAND_TIMEOUT = 5.0
# Every key and channel of the bundle starts with this.
PREFIX = "bundle"
SENTINEL_SCHEME = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
SENTINEL_PORT = 26379
# A sentinel answers at once or is not there: the next one is asked.
SENTINEL_TIMEOUT = 1.0
T = TypeVar("T")

# Connections of a process's pool, and how long a command waits for one of them.
POOL_SIZE = 64
POOL_WAIT_SECONDS = 5.0
_clients: dict[str, redis.Redis] = {}  # URL -> its client (tests change the environment between apps)
_managers: dict[str, Sentinel] = {}  # Sentinel URL -> the clients of its sentinels


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
        pool = _pool(
            url,
            blocking=True,
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
    pool = _pool(
        url,
        blocking=False,
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


@dataclass(frozen=True)
class SentinelURL:
    """A `redis+sentinel://` REDIS_URL, parsed. The password is Redis's and the
    sentinels' (the data role gives them the same); a username, if any, is Redis's."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int
    username: str | None
    password: str | None


SENTINEL_FORM = "redis+sentinel://[:password@]host:port,host:port,.../<master name>/<db>"


def parse_sentinel_url(url: str) -> SentinelURL:
    """The parts of a Sentinel URL; ConfigError naming REDIS_URL (never the password)
    when it is not one."""
    rest = url.removeprefix(SENTINEL_SCHEME)
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    master, _, db = path.partition("/")
    db = db.rstrip("/")
    if not master or not (db.isdigit() or db == ""):
        raise ConfigError(f"REDIS_URL names no master set and database number: it must read {SENTINEL_FORM}")
    return SentinelURL(
        sentinels=tuple(_host_port(h) for h in hosts.split(",")),
        master=unquote(master),
        db=int(db or 0),
        username=unquote(username) or None,
        password=unquote(password) or None,
    )


def _host_port(text: str) -> tuple[str, int]:
    # "host", "host:port", "[v6 address]" or "[v6 address]:port"
    host, port = text, ""
    if text.startswith("["):
        host, _, after = text[1:].partition("]")
        port = after.removeprefix(":")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not host or not (port.isdigit() or port == "") or "@" in host:
        raise ConfigError(f"REDIS_URL names a sentinel that is not host:port: it must read {SENTINEL_FORM}")
    return host, int(port or SENTINEL_PORT)


class SentinelConnection(SentinelManagedConnection):
    """A connection to the master the sentinels name each time it connects. redis-py
    (8.1) asks them in `connect` only, while a command on a dropped connection
    reconnects through `connect_check_health`: a command retried after a time-out went
    back to the old master, frozen, and timed out again. Every connection goes through
    here, so every one asks. (Master pools only: the bundle reads no replica.)"""

    def connect(self) -> None:
        self.retry.call_with_retry(
            lambda: self.connect_check_health(check_health=True, retry_socket_connect=False),
            lambda error: self.disconnect(error),  # type: ignore[no-untyped-call]
        )

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self._sock:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's pool (its connections ask the sentinels for the master) with the
    blocking pool's bound: past max_connections a command waits for a connection."""


def _sentinel_pool(pool_class: type[SentinelConnectionPool], url: str, **options: Any) -> SentinelConnectionPool:
    parsed = parse_sentinel_url(url)
    return pool_class(
        parsed.master,
        _sentinels(url, parsed),
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=COMMAND_TIMEOUT,
        connection_class=SentinelConnection,
        **options,
    )


def _sentinels(url: str, parsed: SentinelURL) -> Sentinel:
    # One per URL: the broker makes a subscriber connection at each reconnection, and
    # each would otherwise leave its own connections to the sentinels behind.
    if url in _managers:
        return _managers[url]
    _managers[url] = Sentinel(  # type: ignore[no-untyped-call]
        parsed.sentinels,
        sentinel_kwargs={
            "password": parsed.password,
            "socket_connect_timeout": SENTINEL_TIMEOUT,
            "socket_timeout": SENTINEL_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),  # a sentinel that fails: the next one is asked
            "client_name": connection_name("sentinel-client"),
        },
    )
    return _managers[url]


def describe_url(url: str) -> str:
    """Where a REDIS_URL points, without its password: for a start line."""
    if url.startswith(SENTINEL_SCHEME):
        parsed = parse_sentinel_url(url)
        sentinels = ",".join(f"{h}:{p}" for h, p in parsed.sentinels)
        return f"redis master set {parsed.master} (sentinels {sentinels}) db {parsed.db}"
    kwargs = redis.connection.parse_url(url)
    where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port', 6379)}"
    return f"redis {where} db {kwargs.get('db', 0)}"


def _pool(url: str, blocking: bool, **options: Any) -> redis.ConnectionPool:
    """The pool of `url` (`blocking`: a command waits for a free connection, see
    for_url), its connections with the bundle's time-outs."""
    if url.startswith(SENTINEL_SCHEME):
        return _sentinel_pool(BlockingSentinelPool if blocking else SentinelConnectionPool, url, **options)
    from_url = redis.BlockingConnectionPool.from_url if blocking else redis.ConnectionPool.from_url
    return _from_url(from_url, url, **options)


def _from_url(from_url: Callable[..., T], url: str, **options: Any) -> T:
    # redis-py's own message may quote a part of the URL, the password perhaps: not shown.
    if not url.startswith(SCHEMES):
        raise ConfigError(f"REDIS_URL must start with one of {', '.join(SCHEMES)}")
    try:
        return from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=COMMAND_TIMEOUT, **options)
    except ValueError:
        raise ConfigError(
            "REDIS_URL is not a valid Redis URL (redis://[:password@]host:port/db, rediss://...,"
            f" unix:///path/to/socket?db=N or {SENTINEL_FORM})"
        ) from None
