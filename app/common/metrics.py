"""Prometheus metrics of a service, summed across its gunicorn workers (issue #35).

A service declares its metrics with prometheus_client's classes at module level,
named `bundle_<service>_<what>[_<unit>][_total]`:

    from prometheus_client import Counter, Gauge, Histogram
    APPENDS = Counter("bundle_decks_appends_total", "Events appended to sessions' logs")
    OPEN = Gauge("bundle_decks_sessions_with_listeners", "...", multiprocess_mode="livesum")

Every Gauge names a live multiprocess mode ("livesum", "liveall", "livemax",
"livemin", "livemostrecent"): the files of other modes outlive their worker.
A value that is cheaper to read when scraped than to keep up to date (a queue's
length in the database, a probe's state) is a collector given to `on_scrape`.
The `/metrics` route and the request metrics are app.common.metrics_http's (this
module imports no Flask: job workers import it through app.common.db).

How the workers' values are summed: prometheus_client's multiprocess mode. Each
worker writes its values to files of its own (`<type>_<pid>.db`, memory-mapped) in
`PROMETHEUS_MULTIPROC_DIR`, which gunicorn.conf.py sets in the master before any
worker imports prometheus_client (under systemd `/run/bundle-<service>/metrics`) and
empties at the master's start. `GET /metrics` (metrics_http) is answered by whichever
worker takes the request: it reads every file, with a registry made for that scrape,
plus the `on_scrape` collectors of that worker. Without the variable (a command, a
unit test, `METRICS=off` under gunicorn) the process's own default registry serves.

The files of a dead worker are never removed by prometheus_client (its issue 204: with
5,000 of them a scrape took 10 s). Here a worker's live gauges go when the master
reaps it (gunicorn.conf.py's child_exit: only files are removed there, in a signal
context), and a scrape folds the counter, histogram and summary files of workers that
no longer run into one archive file per type (`counter_archive.db`...), key by key:
a key is a whole sample with its labels (a histogram's buckets are stored per bucket,
not cumulated), so a sum per key keeps every count exact. Folding and reading happen
under one exclusive `flock` on `metrics.lock` in the folder: two workers scraping at
once never see a file vanish between listing and reading it. A dead worker's file is
renamed `*.folding` before it is read, and its pid checked again: a new worker that
took that pid meanwhile gets the file back. So the folder holds, at
any scrape, the files of the running workers plus one archive per type, however many
workers came and went.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, cast

from gevent import monkey
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from app.common import config, offload
from gunicorn_systemd import alive

# time.sleep as it was before gevent's patch: `locked` waits in a real thread.
_thread_sleep = monkey.get_original("time", "sleep")

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The file types whose values a dead worker leaves for good (gauges are all live).
ARCHIVED_TYPES = ("counter", "histogram", "summary")
LOCK_FILE = "metrics.lock"
# A dead process's file while it is being folded (`_claim`): never read as a `*.db`.
FOLDING = ".folding"
ARCHIVE = "archive"
# The flock is tried without blocking, then again after this pause (a greenlet
# waiting never blocks its worker's loop), for at most LOCK_WAIT_SECONDS.
LOCK_RETRY_SECONDS = 0.005
LOCK_WAIT_SECONDS = 10.0
_WORKER_FILE = re.compile(r"^(?P<type>[a-z]+)_(?P<pid>[0-9]+)\.db$")
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(?P<pid>[0-9]+)\.db$")

BUILD_INFO = Gauge(
    "bundle_build_info",
    "1, labelled with the bundle's version (VERSION) and the newest schema step the code needs (`none`: no database)",
    ["service", "version", "schema_version"],
    multiprocess_mode="livemax",
)


class ScrapeCollector(Protocol):
    """What on_scrape takes: prometheus_client's collector interface."""

    def collect(self) -> Iterable[Metric]: ...


_ON_SCRAPE: list[ScrapeCollector] = []
# The service this process serves (set_service): the `service` label of the shared mechanisms.
_service = "none"


def on_scrape(collector: ScrapeCollector) -> None:
    """Run `collector` in the worker that answers each scrape (its values are that
    worker's reading, not a sum across workers). Call once per process, at init_app."""
    if collector not in _ON_SCRAPE:
        _ON_SCRAPE.append(collector)


def set_service(name: str) -> None:
    """The service this process serves (create_app, through app.common.metrics_http)."""
    global _service
    _service = name


def service() -> str:
    """The service this process serves, for the `service` label of app.common's metrics
    (`none` before create_app has run: a command, a job worker)."""
    return _service


_M = TypeVar("_M", Counter, Gauge, Histogram)
_CHILDREN: dict[tuple[int, str, tuple[str, ...]], Any] = {}


def of_service(metric: _M, *labels: str) -> _M:
    """`metric.labels(service(), *labels)`, found once per metric, service and labels: a
    hot path (a pool checkout, a publish) pays a dict lookup instead of labels()' own
    work. `labels`: the values of the labels after `service`, from a closed set."""
    key = (id(metric), _service, labels)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(_service, *labels)
    return cast(_M, child)


def enabled() -> bool:
    """METRICS (config.METRICS): whether `/metrics` and the request metrics exist."""
    return config.METRICS.read()


def multiprocess_dir() -> str | None:
    """The folder the workers' files are in, or None: this process's own registry."""
    return os.environ.get(MULTIPROCESS_ENV) or None


def build_info(version: str, schema_versions: Iterable[int]) -> None:
    """`bundle_build_info` = 1 with `version` and the newest of `schema_versions` (the
    steps the code needs; none: `none`)."""
    newest = max(schema_versions, default=None)
    BUILD_INFO.labels(_service, version, "none" if newest is None else str(newest)).set(1)


# ----------------------------------------------------------------- scraping


class _Scrape:
    """One scrape's collectors, as generate_latest reads a registry."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics
        for collector in list(_ON_SCRAPE):
            yield from collector.collect()


def exposition() -> bytes:
    """The text a scrape answers: the workers' files folded and read (multiprocess, in
    gevent's threadpool: file work, a long fold after many restarts, never blocks the
    worker's loop), or this process's default registry; then the on_scrape collectors,
    on the loop (they may use the worker's greenlets and connections)."""
    folder = multiprocess_dir()
    if folder is None:
        return generate_latest(_Scrape(list(REGISTRY.collect())))
    return generate_latest(_Scrape(offload.blocking(read_files, folder)))


def read_files(folder: str) -> list[Metric]:
    """Every worker's values, summed: the dead workers' files folded first (`compact`),
    all under the folder's lock (a compaction elsewhere would remove files between the
    listing and the reading)."""
    with locked(folder):
        compact(folder)
        return list(MultiProcessCollector.merge(_readable(folder), accumulate=True))  # type: ignore[no-untyped-call]


def _readable(folder: str) -> list[str]:
    """The folder's files, but for one a worker is creating right now (empty until
    prometheus_client sizes it: it would fail the scrape) and one gone meanwhile (a
    live gauge's, removed by the master when its worker exited)."""
    files = []
    for path in glob.glob(os.path.join(folder, "*.db")):
        try:
            if os.path.getsize(path) >= 8:
                files.append(path)
        except FileNotFoundError:
            pass
    return files


@contextmanager
def locked(folder: str) -> Iterator[None]:
    """The folder's exclusive flock: a non-blocking try, again after a short sleep, for
    at most LOCK_WAIT_SECONDS. Taken in a thread of gevent's threadpool (`exposition`):
    the sleep is the operating system's, not gevent's."""
    fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{folder}/{LOCK_FILE} stayed locked for {LOCK_WAIT_SECONDS:g} s") from None
                _thread_sleep(LOCK_RETRY_SECONDS)
        yield
    finally:
        os.close(fd)  # releases the flock


def compact(folder: str) -> int:
    """Fold the counter, histogram and summary files of processes that no longer run
    into `<type>_archive.db`, then remove them (and the live gauges' files of such
    processes); the number of files folded. Call it under `locked(folder)`.

    The new archive is written beside the old one and renamed over it, so a reader
    sees one or the other. Only between that rename and the removal of the folded
    files (a few system calls) would a process killed outright leave their values
    counted twice."""
    dead_by_type: dict[str, list[str]] = defaultdict(list)
    for path in glob.glob(os.path.join(folder, f"*{FOLDING}")):
        # Claimed by a scrape that died before folding it: its process is gone.
        kind = os.path.basename(path).split("_", 1)[0]
        if kind in ARCHIVED_TYPES:
            dead_by_type[kind].append(path)
        else:
            os.remove(path)  # a live gauge's
    for path in glob.glob(os.path.join(folder, "*.db")):
        name = os.path.basename(path)
        match = _WORKER_FILE.match(name)
        if match and match["type"] in ARCHIVED_TYPES and not running(int(match["pid"])):
            claimed = _claim(path, int(match["pid"]))
            if claimed is not None:
                dead_by_type[match["type"]].append(claimed)
        live = _LIVE_GAUGE_FILE.match(name)
        if live and not running(int(live["pid"])):
            # No worker the master reaped (then child_exit removed it): the process of
            # a reload's preflight (gunicorn_systemd.py), or a worker of a master that died.
            claimed = _claim(path, int(live["pid"]))
            if claimed is not None:
                os.remove(claimed)
    for kind, dead in dead_by_type.items():
        archive = os.path.join(folder, f"{kind}_{ARCHIVE}.db")
        totals: dict[str, float] = defaultdict(float)
        for path in ([archive] if os.path.exists(archive) else []) + dead:
            if os.path.getsize(path) < 8:
                continue  # its worker died while creating it: nothing in it
            for key, value, _timestamp, _position in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
                totals[key] += value
        partial = os.path.join(folder, f"{kind}_{ARCHIVE}.partial")  # not *.db: never read as one
        if os.path.exists(partial):
            os.remove(partial)  # left by a scrape that died while writing it
        written = MmapedDict(partial)  # type: ignore[no-untyped-call]
        try:
            for key, value in totals.items():
                written.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
        finally:
            written.close()  # type: ignore[no-untyped-call]
        os.replace(partial, archive)
        for path in dead:
            os.remove(path)
    return sum(len(dead) for dead in dead_by_type.values())


def _claim(path: str, pid: int) -> str | None:
    """The file `path` of a process `pid` found dead, renamed to `*.folding` (which no
    process opens) and so the caller's to fold or remove; None when it is not: gone
    already, or `pid` runs again (a new worker took the pid between the check and the
    rename, and may have opened the file: it is put back, and that worker carries its
    values on)."""
    claimed = path[: -len(".db")] + FOLDING
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    if not running(pid):
        return claimed
    try:
        os.link(claimed, path)  # never over a file the new process made after the rename
    except FileExistsError:
        return claimed  # the new process has a file of its own: this one is the dead one's
    os.remove(claimed)
    return None


# Whether a pid runs (a zombie, dead but not yet reaped, does not): gunicorn_systemd's,
# which imports the standard library only.
running = alive
