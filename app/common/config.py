"""Configuration read from the environment through small typed helpers.

Each service reads its variables once, at start, through these helpers, so that a
bad value fails the start with a message naming the variable.

A service declares each variable it reads as one of the `Variable` kinds below
(`Text`, `Integer`, `Seconds`, `Choice`, `Flag`): its name, default, bounds and
meaning in one place. The declaration reads the variable with the `env_*` helper of
its kind, and `python -m devtools.reference` writes the reference tables of
docs/services/ from the declarations, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The release this checkout is (VERSION): live processes register under it, backups record it.
RELEASE = (PROJECT_ROOT / "VERSION").read_text().strip()


class ConfigError(ValueError):
    pass


def env_str(name: str, default: str = "") -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def env_int(name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = env_str(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def env_seconds(name: str, default: float, maximum: float = 3600) -> float:
    """A positive number of seconds (fractions allowed)."""
    raw = env_str(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not 0 < value <= maximum:
        raise ConfigError(f"{name} must be between 0 and {maximum} seconds, got {value}")
    return value


def env_choice(name: str, default: str, choices: Sequence[str]) -> str:
    value = env_str(name, default).lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_bool(name: str, default: bool = False) -> bool:
    raw = env_str(name).lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def data_dir(service: str) -> str:
    """`DATA_DIR` made absolute; blank or unset means `<project>/var/<service>`.

    Only the path is computed: the layout below it is created lazily by the service.
    """
    raw = DATA_DIR.read()
    path = Path(raw) if raw else PROJECT_ROOT / "var" / service
    return str(path.expanduser().resolve())


# -- declarations ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Variable:
    """One environment variable: its `name`, what it means (`doc`, one sentence or
    two), and `shown_default`, the default as the reference shows it (Markdown) when
    the code computes it (from DATA_DIR, another variable). A plain `Variable` is read by code
    that parses it itself (`os.environ`, a process that may not import the app);
    `values` then says what it takes."""

    name: str
    doc: str
    shown_default: str | None = None
    values: str = "text"

    def reference(self) -> tuple[str, str]:
        """(default, values) as the reference tables show them."""
        return (self.shown_default or "", self.values)


@dataclass(frozen=True, kw_only=True)
class Text(Variable):
    """A string, stripped of surrounding blanks; blank means the default. With
    `strip=False` the value is taken as it is (a password may end in a space)."""

    default: str = ""
    strip: bool = True

    def read(self, default: str | None = None) -> str:
        """The value; `default` replaces the declared one when the code computes it."""
        if not self.strip:
            return os.environ.get(self.name, "")
        return env_str(self.name, self.default if default is None else default)

    def reference(self) -> tuple[str, str]:
        return (_shown(self.shown_default, self.default), self.values)


@dataclass(frozen=True, kw_only=True)
class Integer(Variable):
    default: int
    minimum: int | None = None
    maximum: int | None = None

    def read(self, default: int | None = None, minimum: int | None = None) -> int:
        """The value; `default` and `minimum` replace the declared ones when they
        depend on another variable."""
        return env_int(
            self.name,
            self.default if default is None else default,
            self.minimum if minimum is None else minimum,
            self.maximum,
        )

    def reference(self) -> tuple[str, str]:
        return (_shown(self.shown_default, self.default), "integer" + _bounds(self.minimum, self.maximum))


@dataclass(frozen=True, kw_only=True)
class Seconds(Variable):
    default: float
    maximum: float = 3600

    def read(self) -> float:
        return env_seconds(self.name, self.default, self.maximum)

    def reference(self) -> tuple[str, str]:
        default = self.shown_default if self.shown_default is not None else f"`{self.default:g}`"
        return (default, f"seconds, more than 0 and at most {self.maximum:g}")


@dataclass(frozen=True, kw_only=True)
class Choice(Variable):
    default: str
    choices: tuple[str, ...]

    def read(self) -> str:
        return env_choice(self.name, self.default, self.choices)

    def reference(self) -> tuple[str, str]:
        return (_shown(self.shown_default, self.default), " | ".join(self.choices))


@dataclass(frozen=True, kw_only=True)
class Flag(Variable):
    default: bool = False

    def read(self) -> bool:
        return env_bool(self.name, self.default)

    def reference(self) -> tuple[str, str]:
        return ("`1`" if self.default else "`0`", "boolean (1/0, true/false, yes/no, on/off)")


def _shown(shown_default: str | None, default: object) -> str:
    if shown_default is not None:
        return shown_default
    return "" if default == "" else f"`{default}`"


def _bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f", {minimum} to {maximum}"
    if minimum is not None:
        return f", at least {minimum}"
    if maximum is not None:
        return f", at most {maximum}"
    return ""


V = TypeVar("V", bound=Variable)


class Variables:
    """The variables one part of the bundle declares, in the order the reference lists
    them. `add` returns the declaration, so a module keeps it under a name of its own.
    `includes`: the shared groups that part reads as well (SHARED, OUTBOUND)."""

    def __init__(self, title: str, includes: Sequence[Variables] = ()) -> None:
        self.title = title
        self.includes = tuple(includes)
        self._declared: dict[str, Variable] = {}

    def add(self, variable: V) -> V:
        if variable.name in self._declared:
            raise ValueError(f"{variable.name} is declared twice in {self.title}")
        self._declared[variable.name] = variable
        return variable

    def __iter__(self) -> Iterator[Variable]:
        return iter(self._declared.values())

    def names(self) -> list[str]:
        return list(self._declared)

    def groups(self) -> list[Variables]:
        """This group, then the groups it includes (each once), in order."""
        seen: list[Variables] = [self]
        for group in self.includes:
            seen += [g for g in group.groups() if g not in seen]
        return seen


# What every service reads: the process model (DESIGN.md) and the shared mechanisms.
SHARED = Variables("every service")
SERVICE = SHARED.add(
    Variable(
        name="SERVICE",
        values="workspace | decks | notebook | audio | wizard",
        doc="Which service this process is (wsgi.py, gunicorn.conf.py); anything else stops the start.",
    )
)
HOST = SHARED.add(
    Variable(
        name="HOST", shown_default="`127.0.0.1`", values="address", doc="The address gunicorn binds (gunicorn.conf.py)."
    )
)
PORT = SHARED.add(
    Variable(
        name="PORT",
        shown_default="the service's loopback port",
        values="port",
        doc="The port gunicorn binds (gunicorn.conf.py).",
    )
)
WEB_CONCURRENCY = SHARED.add(
    Variable(
        name="WEB_CONCURRENCY",
        shown_default="`1`",
        values="integer",
        doc="gunicorn's worker processes. More than one needs REDIS_URL in a service that keeps shared state.",
    )
)
WORKER_CONNECTIONS = SHARED.add(
    Variable(
        name="WORKER_CONNECTIONS",
        shown_default="`8192`",
        values="integer",
        doc="The connections one gevent worker holds at once (gunicorn.conf.py).",
    )
)
DATA_DIR = SHARED.add(
    Text(
        name="DATA_DIR",
        shown_default="`./var/<service>`",
        values="path",
        doc="The root of the service's stored data, made absolute; the layout below it is created lazily.",
    )
)
REDIS_URL = SHARED.add(
    Text(
        name="REDIS_URL",
        values="redis://, rediss:// or redis+sentinel:// URL",
        doc="Redis for live events, rate limits and locks shared by several workers or hosts; "
        "blank: all of it in the process. With Sentinel: "
        "`redis+sentinel://:password@host:26379,host:26379,host:26379/<master name>/<db>` (the services "
        "follow the master after a failover). A secret (it may hold a password).",
    )
)
LOG_FORMAT = SHARED.add(
    Choice(
        name="LOG_FORMAT",
        default="text",
        choices=("text", "json"),
        doc="The form of the log on stderr (app/common/logsetup.py): `text`, one line a record; "
        "`json`, one JSON object a line (time, level, service, logger, message, pid, request id; "
        "method, route, status and duration_ms on a request's line), gunicorn's own records too.",
    )
)
METRICS = SHARED.add(
    Flag(
        name="METRICS",
        default=True,
        doc="Prometheus metrics: `/metrics` on the loopback port, request metrics, and the workers' files in "
        "PROMETHEUS_MULTIPROC_DIR (gunicorn.conf.py reads it too). `0`: none of it (a bench's comparison).",
    )
)
PROMETHEUS_MULTIPROC_DIR = SHARED.add(
    Variable(
        name="PROMETHEUS_MULTIPROC_DIR",
        shown_default="`$RUNTIME_DIRECTORY/metrics`, else a temporary folder",
        values="path",
        doc="The folder of the workers' metrics files (prometheus_client's multiprocess mode), set by "
        "gunicorn.conf.py; emptied of them when the master starts. A folder the admin names gets a subfolder "
        "per service. Unset in a command: its own registry.",
    )
)
RUNTIME_DIRECTORY = SHARED.add(
    Variable(
        name="RUNTIME_DIRECTORY",
        values="path",
        doc="Set by systemd (RuntimeDirectory=, /run/bundle-<service>): gunicorn's state file and the "
        "metrics folder go there.",
    )
)

# What a service that calls an outside provider over HTTPS also reads (app.common.provider_http).
OUTBOUND = Variables("services that call providers")
REQUESTS_CA_BUNDLE = OUTBOUND.add(
    Variable(
        name="REQUESTS_CA_BUNDLE",
        values="path",
        doc="A CA bundle that provider certificates are checked against instead of the system's.",
    )
)
CURL_CA_BUNDLE = OUTBOUND.add(
    Variable(name="CURL_CA_BUNDLE", values="path", doc="The same, when REQUESTS_CA_BUNDLE is not set.")
)
