"""`/metrics` of a real gunicorn with 4 workers: counts summed across the workers, kept
exact across worker restarts (SIGTERM, SIGKILL, gunicorn's max_requests) and reloads,
with the folder of the workers' files kept small; emptied when the master starts
again; nothing at all with METRICS=off. The deck service: cheap to start."""

import json
import os
import signal

import requests
from prometheus_client.parser import text_string_to_metric_families

from devtools.waiting import wait_for

WORKERS = 4
RESTART_ROUNDS = 8  # 32 workers replaced
HEALTHZ = (("method", "GET"), ("route", "/healthz"), ("service", "decks"), ("status", "2xx"))


def scrape(service):
    response = requests.get(f"{service.base_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def healthz_count(service):
    return scrape(service).get(("bundle_http_requests_total", HEALTHZ), 0.0)


def get_healthz(service, count):
    """`count` requests, each on a connection of its own (the kernel spreads them over
    the workers), each answered 200."""
    for _ in range(count):
        response = requests.get(f"{service.base_url}/healthz", headers={"Connection": "close"}, timeout=30)
        assert response.status_code == 200


def metrics_files(service):
    return sorted(os.listdir(service.runtime_dir / "metrics"))


def test_a_counter_reads_the_sum_over_four_workers(start_service):
    service = start_service("decks", workers=WORKERS)
    get_healthz(service, 200)
    assert healthz_count(service) == 200
    # Each worker that answered has its own file: the sum is not one worker's count.
    assert len([name for name in metrics_files(service) if name.startswith("counter_")]) >= 2
    samples = scrape(service)
    count = ("bundle_http_request_duration_seconds_count", HEALTHZ[:3])
    assert samples[count] == 200
    build = [key for key in samples if key[0] == "bundle_build_info"]
    assert len(build) == 1 and samples[build[0]] == 1  # one, not one per worker


def replace_every_worker(service, how):
    """Signal every worker with `how` and wait until as many new ones have loaded the
    app (the master's state file, gunicorn_systemd.py)."""
    old = set(service.worker_pids())
    for pid in old:
        os.kill(pid, how)

    def replaced():
        state = json.loads((service.runtime_dir / "gunicorn.json").read_text())
        return state["ready"] and not old & set(state["workers"])

    wait_for(replaced, "new workers")
    return len(old)


def test_counts_stay_exact_and_the_folder_small_across_many_worker_restarts(start_service):
    """Every worker stopped at once, again and again (SIGTERM, or SIGKILL: no goodbye),
    with requests on each between; gunicorn's max_requests replaces a few more."""
    service = start_service("decks", workers=WORKERS, env={"GUNICORN_CMD_ARGS": "--max-requests 7"})
    restarts = 0
    for round_ in range(RESTART_ROUNDS):
        get_healthz(service, 10)
        restarts += replace_every_worker(service, signal.SIGKILL if round_ % 3 == 2 else signal.SIGTERM)
    assert restarts == RESTART_ROUNDS * WORKERS
    # Every scrape is a request too, on the /metrics route: the /healthz count is exact.
    assert healthz_count(service) == RESTART_ROUNDS * 10
    files = metrics_files(service)
    # The running workers' files (4 kinds at most: counters, histograms, two kinds of
    # live gauges), two archives and the lock; nothing of the dead workers.
    assert len(files) <= WORKERS * 4 + 3, files
    assert {"counter_archive.db", "histogram_archive.db"} <= set(files)
    get_healthz(service, 10)
    assert healthz_count(service) == RESTART_ROUNDS * 10 + 10


def test_a_reload_keeps_the_counts_and_a_restart_empties_the_folder(start_service):
    service = start_service("decks", workers=WORKERS)
    get_healthz(service, 40)
    service.reload()
    get_healthz(service, 40)
    assert healthz_count(service) == 80
    service.restart()  # a new master: the files of the last one are gone
    assert healthz_count(service) == 0


def test_metrics_off_serves_none_and_writes_no_file(start_service):
    service = start_service("decks", workers=2, env={"METRICS": "off"})
    get_healthz(service, 5)
    assert requests.get(f"{service.base_url}/metrics", timeout=10).status_code == 404
    assert not (service.runtime_dir / "metrics").exists()
