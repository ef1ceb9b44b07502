"""DATABASE_URL's PostgreSQL form, read once here for every connection the bundle opens
(the services' pools, the commands, copy-to-postgres, the tests' and benches' peeks).

    postgresql://user:password@host:5432/name
    postgresql://user:password@h1:5432,h2:5432,h3:5432/name?target_session_attrs=read-write

The second is libpq's multi-host URL: a connection tries the hosts in turn and keeps the
first that accepts writes, so after a failover (Patroni promoting a standby) new
connections reach the new primary with no change of configuration. libpq itself parses
the URL (psycopg's `conninfo_to_dict`), so every form libpq takes is taken, and nothing
libpq would refuse at the first connection passes here.

Added unless the URL says otherwise:
- `target_session_attrs=read-write` when the URL names several hosts: a standby (read
  only) must never be the one a service writes to.
- `connect_timeout` (CONNECT_TIMEOUT_SECONDS): libpq waits that long per host, so a host
  that vanished (no FIN, no RST: its SYN or its startup message goes unanswered) costs a
  connection a few seconds before the next host is tried, not TCP's two minutes.
- `tcp_user_timeout` and keepalives (TCP_USER_TIMEOUT_MS, KEEPALIVE_*): an open
  connection whose host vanished mid-statement fails within seconds (the kernel gives
  up on data, or keepalive probes, left unacknowledged) instead of waiting on TCP's
  retransmissions for about 15 minutes: the request gets its 503 and the pool drops
  the connection.
"""

from urllib.parse import unquote

from psycopg import Error as PsycopgError
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from app.common.config import ConfigError

SCHEMES = ("postgresql://", "postgres://")
# libpq's own minimum is 2 s. 3 s is many round trips of a data network under load, and
# short against the 10 s a request may wait for a pooled connection (db.POOL_WAIT_SECONDS).
CONNECT_TIMEOUT_SECONDS = 3
# Data unacknowledged for 5 s: the host is gone (a loaded LAN acknowledges in
# milliseconds; a long statement is not data in flight, the keepalives watch it).
TCP_USER_TIMEOUT_MS = 5000
# An idle or waiting connection probes its host after 5 s of silence, every 2 s, and
# gives up after 3 unanswered probes (tcp_user_timeout cuts that to 5 s in all).
KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_COUNT = 3


def is_postgres(url: str) -> bool:
    return url.startswith(SCHEMES)


def postgres_params(url: str) -> dict[str, str]:
    """libpq's keywords for `url` (a DATABASE_URL of the PostgreSQL form), with the
    bundle's defaults (above) where the URL sets none. ConfigError, naming DATABASE_URL
    and never its password, when libpq would refuse it or it names no database."""
    if not is_postgres(url):
        raise ConfigError(f"DATABASE_URL must be postgresql://..., got {url.split(':', 1)[0]}:...")
    try:
        params = {key: str(value) for key, value in conninfo_to_dict(url).items()}
    except PsycopgError as error:
        reason = _without_secret(str(error).strip().splitlines()[0] if str(error).strip() else "", url)
        raise ConfigError(f"DATABASE_URL is not a valid PostgreSQL URL: {reason}") from None
    _check_ports(params.get("port", ""))
    if not params.get("dbname"):
        raise ConfigError("DATABASE_URL names no database: postgresql://user:password@host:5432/<database>")
    if "," in params.get("host", ""):
        params.setdefault("target_session_attrs", "read-write")
    params.setdefault("connect_timeout", str(CONNECT_TIMEOUT_SECONDS))
    params.setdefault("tcp_user_timeout", str(TCP_USER_TIMEOUT_MS))
    params.setdefault("keepalives", "1")
    params.setdefault("keepalives_idle", str(KEEPALIVE_IDLE_SECONDS))
    params.setdefault("keepalives_interval", str(KEEPALIVE_INTERVAL_SECONDS))
    params.setdefault("keepalives_count", str(KEEPALIVE_COUNT))
    return params


def postgres_conninfo(url: str, **extra: str) -> str:
    """`url` as a libpq connection string, the defaults added, `extra` keywords on top
    (application_name, options): what psycopg.connect takes."""
    return make_conninfo(**{**postgres_params(url), **extra})


def hosts(url: str) -> list[str]:
    """The `host:port` pairs `url` names, in the order connections try them."""
    params = postgres_params(url)
    names = params.get("host", "").split(",")
    ports = params.get("port", "").split(",")
    if len(ports) == 1:  # one port for every host
        ports = ports * len(names)
    return [f"{name}:{port or 5432}" for name, port in zip(names, ports, strict=False)]


def _check_ports(ports: str) -> None:
    """libpq only refuses a bad port when it connects; a start should say it first."""
    for port in ports.split(",") if ports else []:
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"DATABASE_URL has an invalid port {port!r}: each host is host or host:port (1-65535)")


def _without_secret(message: str, url: str) -> str:
    """libpq's message, with the URL's password (which it may quote, undecoded) hidden."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    if "@" in authority:
        userinfo = authority.rsplit("@", 1)[0]
        if ":" in userinfo:
            secret = userinfo.split(":", 1)[1]
            for form in {secret, unquote(secret)} - {""}:
                message = message.replace(form, "***")
    return message
