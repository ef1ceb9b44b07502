"""Metrics in the process: the request metrics and `/metrics` of an app (Flask's test
client, this process's default registry), the switch, and the folding of dead
workers' files (app.common.metrics.compact) on files written here as workers write them."""

import fcntl
import os
import threading
import time
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
from tests.support.metrics import scrape_client as scrape

# No process has this pid: above the largest pid_max Linux allows (2**22).
DEAD = 2**22 + 1


def requests_of(samples, route, method="GET", status="2xx"):
    return samples.value("bundle_http_requests_total", method=method, route=route, service="decks", status=status) or 0


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
    assert "not-a-session" not in after.text and "/no/such" not in after.text
    count = "bundle_http_request_duration_seconds_count"
    assert after.value(count, method="GET", route=route) - (before.value(count, method="GET", route=route) or 0) == 3


def test_build_info_names_the_version_and_schema(decks_client):
    samples = scrape(decks_client)
    version = (Path(__file__).resolve().parents[3] / "VERSION").read_text().strip()
    assert samples.value("bundle_build_info", schema_version="none", service="decks", version=version) == 1.0
    workspace = create_app("workspace").test_client()
    infos = [labels for labels in scrape(workspace).labels_of("bundle_build_info") if labels["service"] == "workspace"]
    assert infos and all(labels["schema_version"].isdigit() for labels in infos)


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
        assert scrape(decks_client).value("bundle_test_queue_length") == 7
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


def test_a_pid_taken_again_while_its_files_are_folded_keeps_the_new_workers_file(tmp_path, monkeypatch):
    """A new worker takes a dead worker's pid between compact's check and its claim of
    the file (os.getpid() plays it): the file is put back, not folded nor removed."""
    folder, pid = str(tmp_path), os.getpid()
    write_counter(folder, pid, "/a", 3)
    checks = []

    def running_again(checked):
        checks.append(checked)
        return len(checks) > 1  # found dead once, then running: the pid was taken again

    monkeypatch.setattr(metrics, "running", running_again)
    with metrics.locked(folder):
        assert metrics.compact(folder) == 0
    assert sorted(os.listdir(folder)) == [f"counter_{pid}.db", metrics.LOCK_FILE]
    assert read(tmp_path)[("bundle_test_requests_total", (("route", "/a"),))] == 3

    # The new worker made a file of its own right after the claim: the claimed one is
    # the dead worker's, and is folded.
    checks.clear()

    def new_file_then_running(checked):
        checks.append(checked)
        if len(checks) == 2:
            write_counter(folder, pid, "/a", 1)
        return len(checks) > 1

    monkeypatch.setattr(metrics, "running", new_file_then_running)
    with metrics.locked(folder):
        assert metrics.compact(folder) == 1
    assert set(os.listdir(folder)) == {"counter_archive.db", f"counter_{pid}.db", metrics.LOCK_FILE}
    assert read(tmp_path)[("bundle_test_requests_total", (("route", "/a"),))] == 4


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
            proxy.connect()  # a pool made without `timeout` waits not at all: refused at once, and counted
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


def test_a_scrape_answers_while_the_pool_is_exhausted(tmp_path, monkeypatch):
    """`/metrics` takes no connection of its own; the notebook's backlog, which needs
    one, waits for one its bound (BOUNDED_READ_SECONDS), then is left out of that
    scrape (logged) instead of failing it."""
    monkeypatch.delenv(metrics.MULTIPROCESS_ENV, raising=False)
    monkeypatch.delenv("METRICS", raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NOTEBOOK_ALLOW_NO_PASSWORD", "1")
    client = create_app("notebook").test_client()
    from app.notebook.core.models import database

    pool = database.obj
    monkeypatch.setattr(pool, "_max_connections", 1)
    holding, release = threading.Event(), threading.Event()

    def hold():
        database.connect()
        holding.set()
        release.wait(10)
        database.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        samples = scrape(client)
        assert samples.value("bundle_notebook_jobs") is None
        assert samples.value("bundle_http_requests_total") is not None
    finally:
        release.set()
        holder.join(10)
    assert scrape(client).value("bundle_notebook_jobs", state="queued") == 0


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_bounded_read_gives_up_on_a_lock_held_elsewhere(engine, tmp_path, request):
    """What a scrape reads from the database (db.bounded_read) waits for a lock a
    migration holds at most its bound, then fails; the connection goes back to the pool."""
    if engine == "postgresql":
        url = request.getfixturevalue("postgres_server").new_database()
        database = connect("psycopg3+pool://" + url.split("://", 1)[1], max_connections=4)
        lock = "LOCK TABLE t IN ACCESS EXCLUSIVE MODE"
    else:
        database = connect(f"sqlite+pool:///{tmp_path / 'x.db'}", max_connections=4, check_same_thread=False)
        lock = "BEGIN EXCLUSIVE"  # no WAL here: a reader waits on the writer's lock
    proxy = DatabaseProxy()
    proxy.initialize(database)
    proxy.execute_sql("CREATE TABLE t (n INTEGER)")
    proxy.close()
    held, release = threading.Event(), threading.Event()

    def hold():
        with proxy.connection_context():
            if engine == "postgresql":
                with proxy.atomic():
                    proxy.execute_sql(lock)
                    held.set()
                    release.wait(10)
            else:
                proxy.execute_sql(lock)
                held.set()
                release.wait(10)
                proxy.execute_sql("COMMIT")

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        with pytest.raises(Exception, match="(?i)lock|timeout|busy"), db.bounded_read(proxy, 0.3):
            proxy.execute_sql("SELECT count(*) FROM t").fetchall()
        assert time.monotonic() - started < 3.0
        assert proxy.is_closed()
    finally:
        release.set()
        holder.join(10)
    with db.bounded_read(proxy, 0.3):
        assert proxy.execute_sql("SELECT count(*) FROM t").fetchone()[0] == 0
    database.close_all()


def test_a_bounded_read_refuses_a_transaction_of_the_callers(tmp_path):
    """Its limits (SET LOCAL on PostgreSQL) would outlast the block inside the caller's
    transaction, and a connection that timed out is dropped with it: refused, and the
    caller's transaction is left as it was."""
    database = connect(f"sqlite+pool:///{tmp_path / 'x.db'}", max_connections=4)
    proxy = DatabaseProxy()
    proxy.initialize(database)
    proxy.execute_sql("CREATE TABLE t (n INTEGER)")
    with proxy.atomic():
        proxy.execute_sql("INSERT INTO t VALUES (1)")
        with pytest.raises(RuntimeError, match="transaction of its own"), db.bounded_read(proxy):
            pass
        assert proxy.in_transaction()
    with db.bounded_read(proxy):  # the caller's open connection, outside a transaction
        assert proxy.execute_sql("SELECT count(*) FROM t").fetchone()[0] == 1
    assert not proxy.is_closed()  # left to the caller
    database.close_all()
