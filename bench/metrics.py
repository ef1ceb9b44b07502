"""What the metrics cost (issue #35). Run by hand:

    .venv/bin/python -m bench.metrics              # every service, 5 rounds of 3 s; 200 restarts
    .venv/bin/python -m bench.metrics --quick      # 2 rounds of 1 s; 20 restarts (smoke run)

1. Throughput: each service is started twice, one gunicorn gevent worker each, with
   METRICS on (the default: `/metrics`, the request metrics, the workers' files) and with
   METRICS=off. Rounds alternate between the two (on, off, on, off...): in each,
   CLIENTS keep-alive clients GET the service's health route (a small answer) for the
   round's time. The figure is the median rate with metrics over the median without, in
   the same run; the goal >= 0.95. Beside it, the worker's CPU time per answer each way
   (from /proc): the steadier figure on a machine the bench shares with others.
2. Scrape time: one deck service with 4 workers; the median time of a `/metrics` scrape
   at the start, then again once 200 workers have been replaced (all 4 stopped with
   SIGTERM at once, 50 times, with requests on each between; their counter and histogram
   files are folded into the archives by the next scrape: app/common/metrics.py), with
   the number of files in the folder, and whether the request counter still reads every
   request sent.

The clients run in this process on gevent, on the same CPUs as the services.
Prints figures; asserts nothing; never collected as a test.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/metrics.py`
    sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.common import (  # noqa: E402
    CpuMeter,
    KeepAliveClient,
    Service,
    build_request,
    exit_on_sigterm,
    fmt_ms,
    percentile,
    print_targets,
    run_header,
    timed_answers,
)
from devtools.services import HEALTH_PATHS  # noqa: E402

SERVICES = ("workspace", "decks", "notebook", "audio", "wizard")
CLIENTS = 8
TARGET_RATIO = 0.95
SCRAPE_WORKERS = 4
SCRAPES = 30  # scrapes timed at each point
SETTLE_S = 2.0
# What a service needs to start here besides SERVICE, PORT and DATA_DIR.
ENVIRONMENTS = {
    "notebook": {
        "NOTEBOOK_PASSWORD": "bench-password-not-secret",
        "NOTEBOOK_ENCRYPTION_KEY": "",  # made at the start (Fernet)
    },
    "workspace": {"WORKSPACE_ACCESS_URL": "http://workspace.localhost"},
}


def rate_round(service, path, seconds):
    """(answers a second, the worker's CPU seconds per answer, non-200 answers, errors)
    of CLIENTS clients for `seconds`."""
    port = service.port
    raw = build_request("GET", path, f"127.0.0.1:{port}")
    statuses, errors, latencies = Counter(), Counter(), []
    deadline = time.perf_counter() + seconds

    def client():
        connection = KeepAliveClient(port)
        try:
            for status, _, _ in timed_answers(connection, lambda: connection.send(raw), deadline, latencies, errors):
                statuses[status] += 1
        finally:
            connection.close()

    meter = CpuMeter(service.worker_pids).start()
    gevent.joinall([gevent.spawn(client) for _ in range(CLIENTS)])
    meter.stop()
    answers = sum(statuses.values())
    cpu_per_answer = meter.worker / answers if answers else float("inf")
    return (
        answers / meter.seconds,
        cpu_per_answer,
        sum(n for s, n in statuses.items() if s != 200),
        sum(errors.values()),
    )


def throughput(root, name, rounds, seconds):
    """{"on": [rates], "off": [rates], "bad": answers not 200 or failed}."""
    env = dict(ENVIRONMENTS.get(name, {}))
    if "NOTEBOOK_ENCRYPTION_KEY" in env:
        from cryptography.fernet import Fernet

        env["NOTEBOOK_ENCRYPTION_KEY"] = Fernet.generate_key().decode()
    started = {}
    try:
        for mode in ("on", "off"):
            data_dir = root / f"{name}-{mode}"
            data_dir.mkdir()
            started[mode] = Service(name, data_dir, root / f"{name}-{mode}.log", env={**env, "METRICS": mode})
        path = HEALTH_PATHS[name]
        for mode in ("on", "off"):  # warm both up: imports, first queries
            rate_round(started[mode], path, 0.5)
        rates, cpu, bad = {"on": [], "off": []}, {"on": [], "off": []}, 0
        for _ in range(rounds):
            for mode in ("on", "off"):
                rate, cpu_per_answer, not_ok, errors = rate_round(started[mode], path, seconds)
                rates[mode].append(rate)
                cpu[mode].append(cpu_per_answer)
                bad += not_ok + errors
        return {**rates, "cpu": cpu, "bad": bad, "path": path}
    finally:
        for service in started.values():
            service.stop()


def scrape_seconds(client, count):
    """Times of `count` scrapes, and the last scrape's text."""
    times, text = [], ""
    for _ in range(count):
        t0 = time.perf_counter()
        status, _, body = client.request("GET", "/metrics")
        times.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        text = body.decode()
    return times, text


def healthz_count(text):
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "bundle_http_requests_total" and sample.labels.get("route") == "/healthz":
                return sample.value
    return 0.0


def replace_workers(service, deadline_s=60.0):
    """SIGTERM every worker and wait until as many new ones have loaded the app (the
    master's state file, gunicorn_systemd.py); the number replaced."""
    state_path = service.running.runtime_dir / "gunicorn.json"
    old = set(service.running.worker_pids())
    for pid in old:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError):
            state = {}
        if state.get("ready") and not old & set(state.get("workers", ())):
            return len(old)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers were not replaced within {deadline_s:g} s")
        gevent.sleep(0.05)


def scrape_after_restarts(root, restarts):
    """The scrape's median time at the start and after `restarts` worker replacements
    (every worker stopped at once, again and again, with requests between)."""
    data_dir = root / "scrape"
    data_dir.mkdir()
    service = Service("decks", data_dir, root / "scrape.log", workers=SCRAPE_WORKERS)
    try:
        folder = service.running.runtime_dir / "metrics"
        before, _ = scrape_seconds(KeepAliveClient(service.port), SCRAPES)
        files_before = len(os.listdir(folder))
        raw = build_request("GET", "/healthz", f"127.0.0.1:{service.port}", {"Connection": "close"})
        sent = replaced = 0
        while replaced < restarts:
            for _ in range(2 * SCRAPE_WORKERS):  # on new connections: spread over the workers
                client = KeepAliveClient(service.port)
                status, _, _ = client.send(raw)
                client.close()
                if status != 200:
                    raise RuntimeError(f"/healthz answered {status}")
                sent += 1
            replaced += replace_workers(service)
        files_dead = len(os.listdir(folder))  # before the next scrape folds them
        scraper = KeepAliveClient(service.port)
        folding, _ = scrape_seconds(scraper, 1)
        gevent.sleep(SETTLE_S)  # the new workers' first moments (imports, connections) pass
        after, text = scrape_seconds(scraper, SCRAPES)
        return {
            "before": before,
            "folding": folding[0],
            "after": after,
            "files": (files_before, files_dead, len(os.listdir(folder))),
            "restarts": replaced,
            "sent": sent,
            "counted": healthz_count(text),
        }
    finally:
        service.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s, 20 restarts: a smoke run")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--restarts", type=int, default=None)
    parser.add_argument("--services", nargs="*", choices=SERVICES, default=list(SERVICES), help="none: part 2 only")
    parser.add_argument("--no-scrape", action="store_true", help="part 1 only")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    restarts = args.restarts or (20 if args.quick else 200)
    exit_on_sigterm()
    print(run_header("metrics: throughput with metrics on/off, scrape time after worker restarts", args.quick))
    root = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    rows = []
    try:
        print(f"1. small GETs, {CLIENTS} keep-alive clients, one worker, {rounds} rounds of {seconds:g} s each way")
        for name in args.services:
            figures = throughput(root, name, rounds, seconds)
            on, off = statistics.median(figures["on"]), statistics.median(figures["off"])
            ratio = on / off if off else 0.0
            cpu_on, cpu_off = statistics.median(figures["cpu"]["on"]), statistics.median(figures["cpu"]["off"])
            cpu_ratio = cpu_off / cpu_on if cpu_on else 0.0
            print(
                f"   {name:<10} GET {figures['path']:<18} on {on:6.0f}/s  off {off:6.0f}/s  ratio {ratio:.3f};"
                f" worker CPU per answer on {cpu_on * 1e6:.0f} us, off {cpu_off * 1e6:.0f} us (off/on {cpu_ratio:.3f})"
                f"  [rounds on: {', '.join(f'{r:.0f}' for r in figures['on'])};"
                f" off: {', '.join(f'{r:.0f}' for r in figures['off'])}; bad answers {figures['bad']}]"
            )
            rows.append((f"{name} on/off rate", f"{ratio:.3f}", f">= {TARGET_RATIO}", ratio >= TARGET_RATIO))
            rows.append((f"{name} off/on CPU per answer", f"{cpu_ratio:.3f}", f">= {TARGET_RATIO}", None))
        if args.no_scrape:
            print_targets(rows)
            return 0
        print(f"2. /metrics of decks with {SCRAPE_WORKERS} workers, before and after {restarts} worker restarts")
        scrape = scrape_after_restarts(root, restarts)
        before, after = scrape["before"], scrape["after"]
        print(
            f"   at start: median {fmt_ms(statistics.median(before))}, p95 {fmt_ms(percentile(before, 95))};"
            f" after {scrape['restarts']} restarts: median {fmt_ms(statistics.median(after))},"
            f" p95 {fmt_ms(percentile(after, 95))}"
        )
        print(
            "   files in the folder: {} at start, {} before the scrape folded the dead workers', {} after".format(
                *scrape["files"]
            )
            + f"; the scrape that folded them took {fmt_ms(scrape['folding'])}"
        )
        print(f"   /healthz requests sent {scrape['sent']}, counted {scrape['counted']:.0f}")
        rows.append(("scrape after restarts", fmt_ms(statistics.median(after)), "-", None))
        exact = scrape["counted"] == scrape["sent"]
        rows.append(("counter exact", f"{scrape['counted']:.0f} of {scrape['sent']}", "all", exact))
        print_targets(rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
