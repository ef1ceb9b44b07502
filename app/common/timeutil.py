"""Timestamps as the bundle writes them: ISO 8601 in UTC with a `Z`."""

from datetime import UTC, datetime


def utc_timestamp(timespec: str = "seconds") -> str:
    return datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
