"""Configuration read from the environment through small typed helpers.

Each service reads its variables once, at start, through these helpers, so that a
bad value fails the start with a message naming the variable.
"""
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    pass


def env_str(name, default=""):
    value = os.environ.get(name, "").strip()
    return value or default


def env_int(name, default, minimum=None, maximum=None):
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


def env_seconds(name, default, maximum=3600):
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


def env_choice(name, default, choices):
    value = env_str(name, default).lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_bool(name, default=False):
    raw = env_str(name).lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def data_dir(service):
    """`DATA_DIR` made absolute; blank or unset means `<project>/var/<service>`.

    Only the path is computed: the layout below it is created lazily by the service.
    """
    raw = env_str("DATA_DIR")
    path = Path(raw) if raw else PROJECT_ROOT / "var" / service
    return str(path.expanduser().resolve())
