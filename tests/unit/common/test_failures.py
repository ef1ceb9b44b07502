"""The kinds of failure (app.common.failures) and the one place that answers them
(app.common.errors): each kind's status, the service's body, its extras."""

import pytest
from flask import Flask

from app.common import errors, failures
from app.common.errors import error_with_field

KINDS = [
    failures.Invalid,
    failures.Unauthenticated,
    failures.Forbidden,
    failures.NotFound,
    failures.Conflict,
    failures.TooLarge,
    failures.UnsupportedType,
    failures.TooManyRequests,
    failures.UpstreamFailed,
    failures.Unavailable,
    failures.UpstreamTimeout,
]


@pytest.fixture
def client():
    app = Flask(__name__)
    errors.register(app, error_with_field)

    @app.get("/kind/<name>")
    def raise_kind(name):
        raise getattr(failures, name)(f"a {name}", field="thing")

    @app.get("/busy")
    def busy():
        raise failures.Unavailable("not now", retry_after=7)

    @app.get("/explicit")
    def explicit():
        raise failures.ApiError(416, "no ranges", field="Range")

    return app.test_client()


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
def test_each_kind_answers_its_status_with_the_services_body(client, kind):
    response = client.get(f"/kind/{kind.__name__}")
    assert response.status_code == kind.status
    assert response.get_json() == {"error": f"a {kind.__name__}", "field": "thing"}


def test_the_statuses_are_distinct_client_or_server_errors():
    statuses = [kind.status for kind in KINDS]
    assert len(set(statuses)) == len(statuses)
    assert all(400 <= status < 600 for status in statuses)


def test_retry_after_becomes_a_header(client):
    response = client.get("/busy")
    assert response.status_code == 503 and response.headers["Retry-After"] == "7"


def test_an_explicit_status_is_kept(client):
    response = client.get("/explicit")
    assert response.status_code == 416 and response.get_json() == {"error": "no ranges", "field": "Range"}


def test_every_kind_is_a_failure_that_a_job_worker_can_record():
    for kind in KINDS:
        error = kind("why")
        assert isinstance(error, failures.Failure) and error.message == "why" and str(error) == "why"
