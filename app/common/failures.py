"""What went wrong, as the handling of a request or the Flask-free work below it (a
job worker's too) says it: one type per kind of failure, a message, and extras
(`field`, `fields`, `retry_after`, `detail`). Nothing here imports Flask.

Each kind carries the HTTP status it answers with; app.common.errors is the one
place that turns any of them into the service's error body, and a job worker records
the message as the job's error. Domain modules raise the kind (`NotFound("no such
notebook")`); a route that must answer with a status no kind names uses `ApiError`.
"""

from typing import Any


class Failure(Exception):
    """The base of every kind: catch it to handle any failure a service can answer."""

    status = 500

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra


class Invalid(Failure):
    """The input is wrong: a field, a body, a query."""

    status = 400


class Unauthenticated(Failure):
    """No credentials, or credentials that are not valid."""

    status = 401


class Forbidden(Failure):
    """The caller is known and may not do this."""

    status = 403


class NotFound(Failure):
    """No such thing, or none the caller may see."""

    status = 404


class Conflict(Failure):
    """The thing exists already, or is in a state that does not allow this."""

    status = 409


class TooLarge(Failure):
    status = 413


class UnsupportedType(Failure):
    """A body in a media type the route does not take."""

    status = 415


class TooManyRequests(Failure):
    status = 429


class UpstreamFailed(Failure):
    """A provider, an agent or another peer refused or answered something unusable."""

    status = 502


class Unavailable(Failure):
    """Not now: a provider not configured, a database or a peer down, a stop under way."""

    status = 503


class UpstreamTimeout(Failure):
    """A peer did not answer in time."""

    status = 504


class ApiError(Failure):
    """A failure with an explicit status: for a status no kind names (416), or one
    carried over from elsewhere (a provider's error, a peer's verdict)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.status = status
