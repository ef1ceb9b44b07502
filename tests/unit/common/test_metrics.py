"""Metrics in the process: the request metrics and `/metrics` of an app (Flask's test
client, this process's default registry), the switch, and the folding of dead
workers' files (app.common.metrics.compact) on files written here as workers write them."""

import fcntl
import os
import threading
from pathlib import Path

import pytest
from peewee import DatabaseProxy
from playhouse.db_url import connect
from playhouse.pool import MaxConnectionsExceeded
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from app.common import broker as broker_module
from app.common import db, metrics, metrics_http, sse
from app.common.broker import LocalBroker
from devtools import reference

# No process has this pid: above the largest pid_max Linux allows (2**22).
DEAD = 2**22 + 1


def scrape(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for sample in family.samples
    }


def requests_of(samples, route, method="GET", status="2xx"):
    labels = (("method", method), ("route", route), ("service", "decks"), ("status", status))
    return samples.get(("bundle_http_requests_total", labels), 0.0)


@pytest.fixture
def decks_client(tmp_path, monkeypatch):
    monkeypatch.delenv(metrics.MULTIPROCESS_ENV, raising=False)
    monkeypatch.delenv("METRICS", raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    return create_app("decks").test_client()


def test_requests_are_counted_by_route_template_never_by_raw_path(decks_client):
    before = scrape(decks_client)
    for _ in range(3):
        assert decks_client.get("/api/sessions/not-a-session").status_code == 404
    decks_client.get("/no/such/path/42")
    decks_client.open("/healthz", method="PROPFIND")
    decks_client.get("/healthz")
    after = scrape(decks_client)
    route = "/api/sessions/<session_id>"
    assert requests_of(after, route, status="4xx") - requests_of(before, route, status="4xx") == 3
    assert requests_of(after, "unmatched", status="4xx") - requests_of(before, "unmatched", status="4xx") == 1
    # PROPFIND on a rule that has no such method: a 405, which matched no rule.
    assert requests_of(after, "unmatched", "other", "4xx") - requests_of(before, "unmatched", "other", "4xx") == 1
    assert requests_of(after, "/healthz") - requests_of(before, "/healthz") == 1
    assert not any("not-a-session" in str(key) or "/no/such" in str(key) for key in after)
    count = ("bundle_http_request_duration_seconds_count", (("method", "GET"), ("route", route), ("service", "decks")))
    assert after[count] - before.get(count, 0.0) == 3


def test_build_info_names_the_version_and_schema(decks_client):
    samples = scrape(decks_client)
    version = (Path(__file__).resolve().parents[3] / "VERSION").read_text().strip()
    labels = (("schema_version", "none"), ("service", "decks"), ("version", version))
    assert samples[("bundle_build_info", labels)] == 1.0
    workspace = create_app("workspace").test_client()
    infos = [key for key in scrape(workspace) if key[0] == "bundle_build_info" and ("service", "workspace") in key[1]]
    assert infos and all(dict(key[1])["schema_version"].isdigit() for key in infos)


def test_on_scrape_collectors_answer_each_scrape(decks_client):
    class Queue:
        calls = 0

        def collect(self):
            Queue.calls += 1
            family = GaugeMetricFamily("bundle_test_queue_length", "A reading made at scrape time")
            family.add_metric([], 7)
            yield family

    collector = Queue()
    metrics.on_scrape(collector)
    try:
        assert scrape(decks_client)[("bundle_test_queue_length", ())] == 7
        scrape(decks_client)
        assert Queue.calls == 2
    finally:
        metrics._ON_SCRAPE.remove(collector)


def test_metrics_off_leaves_no_route_and_counts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("METRICS", "off")
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    client = create_app("decks").test_client()
    labels = ("GET", "/healthz")
    before = metrics_http.HTTP_DURATION.labels("decks", *labels)._sum.get()
    assert client.get("/metrics").status_code == 404
    assert client.get("/healthz").status_code == 200
    assert metrics_http.HTTP_DURATION.labels("decks", *labels)._sum.get() == before


def test_a_bad_switch_stops_the_start(tmp_path, monkeypatch):
    monkeypatch.setenv("METRICS", "perhaps")
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="METRICS must be a boolean"):
        create_app("decks")


# ----------------------------------------------------------------- the folder of the workers' files


def read(folder):
    """{(sample, labels): value} summed across the folder's files, as a scrape reads them."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in MultiProcessCollector(None, str(folder)).collect()
        for sample in family.samples
    }


def write_counter(folder, pid, route, value):
    key = mmap_key("bundle_test_requests", "bundle_test_requests_total", ["route"], [route], "Requests")
    db = MmapedDict(os.path.join(folder, f"counter_{pid}.db"))
    try:
        db.write_value(key, value, 0.0)
    finally:
        db.close()


def write_histogram(folder, pid, observations):
    """A histogram's file, buckets stored per bucket (not cumulated) as a worker does."""
    db = MmapedDict(os.path.join(folder, f"histogram_{pid}.db"))
    buckets = {"0.1": 0.0, "1.0": 0.0, "+Inf": 0.0}
    name, help_text = "bundle_test_seconds", "Seconds"
    for seconds in observations:
        bound = next(b for b in buckets if b == "+Inf" or seconds <= float(b))
        buckets[bound] += 1
    try:
        for bound, count in buckets.items():
            db.write_value(mmap_key(name, name + "_bucket", ["le"], [bound], help_text), count, 0.0)
        db.write_value(mmap_key(name, name + "_sum", [], [], help_text), sum(observations), 0.0)
    finally:
        db.close()


def test_dead_workers_files_fold_into_one_archive_per_type_and_every_count_stays(tmp_path):
    folder = str(tmp_path)
    expected_a = expected_b = 0
    observations = []
    for generation in range(50):  # 50 compactions, each folding two dead workers into the archive
        for worker in range(2):
            write_counter(folder, DEAD + worker, "/a", generation + 1)
            write_counter(folder, DEAD + worker, "/b", 2)
            write_histogram(folder, DEAD + worker, [0.05, 0.5 * worker, 3.0])
            expected_a, expected_b = expected_a + generation + 1, expected_b + 2
            observations += [0.05, 0.5 * worker, 3.0]
        with metrics.locked(folder):
            assert metrics.compact(folder) == 4
    write_counter(folder, os.getpid(), "/a", 5)  # a live worker's file stays as it is
    (tmp_path / f"gauge_livesum_{DEAD}.db").touch()  # a live gauge of a process gone (a reload's preflight)
    with metrics.locked(folder):
        assert metrics.compact(folder) == 0
    assert set(os.listdir(folder)) == {
        "counter_archive.db",
        f"counter_{os.getpid()}.db",
        "histogram_archive.db",
        metrics.LOCK_FILE,
    }
    samples = read(folder)
    assert samples[("bundle_test_requests_total", (("route", "/a"),))] == expected_a + 5
    assert samples[("bundle_test_requests_total", (("route", "/b"),))] == expected_b
    # Buckets cumulated by the reader from the per-bucket sums the archive keeps.
    assert samples[("bundle_test_seconds_bucket", (("le", "0.1"),))] == sum(o <= 0.1 for o in observations)
    assert samples[("bundle_test_seconds_bucket", (("le", "1.0"),))] == sum(o <= 1.0 for o in observations)
    assert samples[("bundle_test_seconds_count", ())] == len(observations)
    assert samples[("bundle_test_seconds_sum", ())] == pytest.approx(sum(observations))


def test_a_scrape_folds_then_reads_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.MULTIPROCESS_ENV, str(tmp_path))
    for pid in range(DEAD, DEAD + 300):
        write_counter(tmp_path, pid, "/a", 1)
    write_counter(tmp_path, os.getpid(), "/a", 1)
    (tmp_path / f"gauge_livesum_{os.getpid()}.db").touch()  # an empty file: a gauge not set yet
    (tmp_path / "counter_archive.partial").write_bytes(b"left by a scrape that died")
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    samples = {s.name: s.value for f in families for s in f.samples}
    assert samples["bundle_test_requests_total"] == 301
    assert not (tmp_path / "counter_archive.partial").exists()
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # the archive and the live worker's


def test_the_lock_is_waited_for_then_given_up(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "LOCK_WAIT_SECONDS", 0.2)
    holder = os.open(tmp_path / metrics.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match="stayed locked"), metrics.locked(str(tmp_path)):
            pass
    finally:
        os.close(holder)
    with metrics.locked(str(tmp_path)):  # released: taken at once
        pass


# ----------------------------------------------------------------- the shared mechanisms' metrics


def value(metric, *labels):
    return metric.labels(*labels)._value.get()


def test_sse_streams_open_counts_each_stream_while_it_is_open():
    service = metrics.service()
    before = value(sse.STREAMS_OPEN, service)
    broker = LocalBroker()
    streams = [sse._records([], broker.subscribe("t"), None, None, 60, "/t") for _ in range(3)]
    for stream in streams:
        assert next(stream) == b": stream open\n\n"
    assert value(sse.STREAMS_OPEN, service) == before + 3
    streams[0].close()  # the client went: the generator's finally
    broker.close_all("server is stopping")  # the others read their closing comment and end
    for stream in streams[1:]:
        assert list(stream) == [b": closed: server is stopping\n\n"]
    assert value(sse.STREAMS_OPEN, service) == before


def test_the_broker_counts_publishes_deliveries_and_lagging_subscribers():
    service = metrics.service()
    counts = (
        lambda: value(broker_module.PUBLISHES, service, "local"),
        lambda: value(broker_module.DELIVERIES, service),
        lambda: value(broker_module.LAGGING_ENDED, service),
    )
    before = [count() for count in counts]
    broker = LocalBroker(max_pending=5)
    slow, fast = broker.subscribe("t"), broker.subscribe("t")
    for n in range(10):
        broker.publish("t", n)
        fast.get(0)
    broker.publish("nobody listens", 1)
    # Two subscribers for messages 0-4; the slow one is dropped at the sixth (5 behind).
    assert [count() - was for count, was in zip(counts, before, strict=True)] == [11, 2 * 5 + 5, 1]
    assert slow.closed_reason == broker_module.LAGGING


def test_the_pool_counts_connections_in_use_and_checkouts_that_found_it_full(tmp_path):
    """Threads (peewee keeps a connection per thread): two hold the pool's two
    connections while a third asks for one."""
    service = metrics.service()
    proxy = DatabaseProxy()
    database = db._measured(connect(f"sqlite+pool:///{tmp_path / 'x.db'}", max_connections=2, stale_timeout=300))
    proxy.initialize(database)
    waits = value(db.POOL_WAITS, service)
    holding, release = threading.Barrier(3), threading.Event()

    def hold():
        proxy.connect()
        holding.wait(10)
        release.wait(10)
        proxy.close()

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for holder in holders:
        holder.start()
    holding.wait(10)
    try:
        assert value(db.POOL_IN_USE, service) == 2
        with pytest.raises(MaxConnectionsExceeded):
            proxy.connect()  # SQLite's pool has no wait: refused at once, and counted
        assert value(db.POOL_WAITS, service) == waits + 1
    finally:
        release.set()
        for holder in holders:
            holder.join(10)
    assert value(db.POOL_IN_USE, service) == 0
    database.close_all()


def test_the_reference_lists_every_metric_with_its_labels():
    rows = {name: (kind, labels) for name, kind, labels, _ in reference.metric_rows()}
    assert rows["bundle_http_requests_total"] == ("counter", ("service", "method", "route", "status"))
    assert rows["bundle_http_request_duration_seconds"] == ("histogram", ("service", "method", "route"))
    assert rows["bundle_sse_streams_open"] == ("gauge (livesum)", ("service",))
    assert all(name.startswith("bundle_") for name in rows)
