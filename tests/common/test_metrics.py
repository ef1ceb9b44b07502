"""`/metrics` of a real gunicorn with 4 workers: counts summed across the workers, kept
exact across worker restarts (SIGTERM, SIGKILL, gunicorn's max_requests) and reloads,
with the folder of the workers' files kept small; emptied when the master starts
again; nothing at all with METRICS=off. The deck service: cheap to start."""

import json
import os
import signal
import subprocess

import requests

from devtools.waiting import wait_for
from gunicorn_systemd import PREFLIGHT
from tests.support.metrics import scrape
from tests.support.shared import ROOT

WORKERS = 4
RESTART_ROUNDS = 8  # 32 workers replaced
HEALTHZ = {"method": "GET", "route": "/healthz", "service": "decks", "status": "2xx"}


def healthz_count(service):
    return scrape(service).value("bundle_http_requests_total", **HEALTHZ) or 0.0


def get_healthz(service, count):
    """`count` requests, each on a connection of its own (the kernel spreads them over
    the workers), each answered 200."""
    for _ in range(count):
        response = requests.get(f"{service.base_url}/healthz", headers={"Connection": "close"}, timeout=30)
        assert response.status_code == 200


def get_healthz_on_each_worker(service, count):
    """`count` requests answered by each worker in turn: the others stopped (SIGSTOP)
    meanwhile, so only that one accepts (which worker the kernel wakes is its choice)."""
    pids = service.worker_pids()
    for pid in pids:
        others = [other for other in pids if other != pid]
        for other in others:
            os.kill(other, signal.SIGSTOP)
        try:
            get_healthz(service, count)
        finally:
            for other in others:
                os.kill(other, signal.SIGCONT)
    return pids


def metrics_files(service):
    return sorted(os.listdir(service.runtime_dir / "metrics"))


def test_a_counter_reads_the_sum_over_four_workers(start_service):
    service = start_service("decks", workers=WORKERS)
    pids = get_healthz_on_each_worker(service, 50)
    assert len(pids) == WORKERS
    assert healthz_count(service) == 50 * WORKERS
    # Each worker has its own file: the sum is not one worker's count.
    assert {f"counter_{pid}.db" for pid in pids} <= set(metrics_files(service))
    samples = scrape(service)
    duration = {key: HEALTHZ[key] for key in ("method", "route", "service")}
    assert samples.value("bundle_http_request_duration_seconds_count", **duration) == 50 * WORKERS
    assert len(samples.labels_of("bundle_build_info")) == 1  # one, not one per worker
    assert samples.value("bundle_build_info") == 1


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


def test_a_reload_makes_the_metrics_folder_if_it_is_missing(start_service):
    """A master started by a release without metrics has no folder, and on a HUP reads
    gunicorn.conf.py again but runs no on_starting: the folder is made where it is set."""
    service = start_service("decks", workers=2)
    get_healthz(service, 5)
    for name in metrics_files(service):
        os.remove(service.runtime_dir / "metrics" / name)
    os.rmdir(service.runtime_dir / "metrics")
    service.reload()
    get_healthz(service, 5)
    assert healthz_count(service) == 5


def test_a_preflight_leaves_no_temporary_folder(tmp_path):
    """Without RUNTIME_DIRECTORY (no systemd) the master makes a temporary folder at its
    start; the preflight of a reload, which reads gunicorn.conf.py too, makes none."""
    env = {key: value for key, value in os.environ.items() if key not in ("RUNTIME_DIRECTORY", "METRICS")}
    env.update(SERVICE="decks", DATA_DIR=str(tmp_path / "data"), TMPDIR=str(tmp_path))
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    done = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", PREFLIGHT], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp_path.glob("bundle-decks-metrics-*"))


def test_two_services_given_one_folder_keep_their_files_apart(start_service, tmp_path):
    shared = tmp_path / "metrics"
    decks = start_service("decks", env={"PROMETHEUS_MULTIPROC_DIR": str(shared)})
    audio = start_service("audio", env={"PROMETHEUS_MULTIPROC_DIR": str(shared)})
    get_healthz(decks, 3)
    for _ in range(2):
        assert requests.get(f"{audio.base_url}/api/audio/health", timeout=30).status_code == 200
    assert sorted(os.listdir(shared)) == ["audio", "decks"]
    decks.restart()  # a master's start empties its own subfolder only
    assert [labels["service"] for labels in scrape(decks).labels_of("bundle_build_info")] == ["decks"]
    audio_requests = scrape(audio).value("bundle_http_requests_total", route="/api/audio/health", service="audio")
    assert audio_requests == 2
