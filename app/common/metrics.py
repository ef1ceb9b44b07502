"""Prometheus metrics of a service, summed across its gunicorn workers (issue #35).

SKELETON: the interface the services use; its mechanism (multiprocess files, their
compaction, the `/metrics` route, request metrics) is being built.

A service declares its metrics with prometheus_client's classes at module level,
named `bundle_<service>_<what>[_<unit>][_total]`:

    from prometheus_client import Counter, Gauge, Histogram
    APPENDS = Counter("bundle_decks_appends_total", "Events appended to sessions' logs")
    OPEN = Gauge("bundle_decks_sessions_with_listeners", "...", multiprocess_mode="livesum")

Every Gauge names a live multiprocess mode ("livesum", "liveall", "livemax",
"livemin", "livemostrecent"): the files of other modes outlive their worker.
A value that is cheaper to read when scraped than to keep up to date (a queue's
length in the database, a probe's state) is a collector given to `on_scrape`.
"""

from collections.abc import Iterable
from typing import Protocol

from prometheus_client.metrics_core import Metric


class ScrapeCollector(Protocol):
    """What on_scrape takes: prometheus_client's collector interface."""

    def collect(self) -> Iterable[Metric]: ...


_ON_SCRAPE: list[ScrapeCollector] = []


def on_scrape(collector: ScrapeCollector) -> None:
    """Run `collector` in the worker that answers each scrape (its values are that
    worker's reading, not a sum across workers). Call once per process, at init_app."""
    if collector not in _ON_SCRAPE:
        _ON_SCRAPE.append(collector)
