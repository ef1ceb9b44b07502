"""The error that the handling of a request, or the Flask-free work below it (a job
worker's too), raises to say what went wrong: a status, a message and extras (`field`,
`retry_after`). app.common.errors turns it into each service's error body; a job
worker records its message as the job's error. Nothing here imports Flask."""


class ApiError(Exception):
    """An error a route wants to answer with: status, message and optional extras
    (for example `fields` for validation errors)."""

    def __init__(self, status, message, **extra):
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra
