"""The HTTP side of the metrics (app.common.metrics): `GET /metrics` and the request
metrics, given to every service by create_app (`register`).

`bundle_http_requests_total{service, method, route, status}`: `route` is the Flask
rule's template (`/api/sessions/<session_id>`), never the raw path (ids would make a
series each), `unmatched` for a request no rule matched (a 404, a 405); `status` its
class (`2xx`...); a method outside the standard set is `other`.
`bundle_http_request_duration_seconds{service, method, route}`: to the response's
start (a stream's headers), not its end; a websocket (101, answered by the time its
socket closes) is counted but not timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from prometheus_client import Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from app.common import metrics

EXTENSION = "bundle.metrics"  # app.extensions' key of the app's Recorder
STARTED = "bundle.metrics_started"  # the environ key of a request's time.perf_counter() at arrival
# The route of a request that matched no rule (a 404, a 405): never its raw path.
UNMATCHED = "unmatched"
STANDARD_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
# Seconds; 0.3 is the API p95 the alert watches (Coder's figure).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# record(method, route template or None: unmatched, status code, seconds to the response's start or None)
Recorder = Callable[[str, str | None, int, float | None], None]

HTTP_REQUESTS = Counter(
    "bundle_http_requests_total",
    "HTTP requests answered, by route template (`unmatched`: no route) and status class (2xx...)",
    ["service", "method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "bundle_http_request_duration_seconds",
    "Time from a request's arrival to its response's start (a stream's headers; websockets are not timed)",
    ["service", "method", "route"],
    buckets=DURATION_BUCKETS,
)


def register(app: Flask) -> None:
    """Give `app` its `/metrics` route and the request metrics (create_app, for every
    service, before the service's own hooks: a hook of its that answers first, as
    `/readyz`'s does, still has its time measured). Nothing when METRICS is off."""
    service = app.config["SERVICE"]
    metrics.set_service(service)
    if not metrics.enabled():
        return
    record = _recorder(service)
    app.extensions[EXTENSION] = record

    # The request object is looked up once per hook, and the start time kept in its WSGI
    # environ: each access through Flask's `g` or `request` proxies costs microseconds.
    def start_timer() -> None:
        request._get_current_object().environ[STARTED] = time.perf_counter()  # type: ignore[attr-defined]

    def count_request(response: Response) -> Response:
        current = request._get_current_object()  # type: ignore[attr-defined]
        started = current.environ.get(STARTED)
        rule = current.url_rule
        record(
            current.method,
            rule.rule if rule is not None else None,
            response.status_code,
            time.perf_counter() - started if started is not None else None,
        )
        return response

    def metrics_view() -> Response:
        """Prometheus' text format: every metric of the service, summed across its
        workers. On the loopback port only: nginx answers 404 to it on every public host."""
        return Response(metrics.exposition(), content_type=CONTENT_TYPE_PLAIN_0_0_4)

    app.before_request(start_timer)
    app.after_request(count_request)
    app.add_url_rule("/metrics", endpoint="metrics", view_func=metrics_view, methods=["GET"])


def recorder(app: Flask) -> Recorder | None:
    """What counts a request that `app` answers without Flask's hooks (the workspace's
    apps front): `record(method, route template, status, seconds)`. None when METRICS
    is off."""
    found: Recorder | None = app.extensions.get(EXTENSION)
    return found


def _recorder(service: str) -> Recorder:
    # Each (method, route, status class)'s two series, found once: labels() costs more
    # than the increments themselves, on every request.
    series: dict[tuple[str, str | None, int], tuple[Any, Any]] = {}  # a closed set: routes x methods x 9

    def record(method: str, route: str | None, status: int, seconds: float | None) -> None:
        # A client's made-up method is `other` before it is a key: the keys stay a closed set.
        key = (method if method in STANDARD_METHODS else "other", route, status // 100)
        found = series.get(key)
        if found is None:
            label = key[1] if key[1] is not None else UNMATCHED
            found = series[key] = (
                HTTP_REQUESTS.labels(service, key[0], label, f"{key[2]}xx"),
                HTTP_DURATION.labels(service, key[0], label),
            )
        found[0].inc()
        # A websocket's 101 is answered when the socket closes (minutes, hours later):
        # its time is no response time, so it stays out of the histogram.
        if seconds is not None and status != 101:
            found[1].observe(seconds)

    return record
