"""Research notebook benchmark: ingest through the API with async processing, then
search latency. Run by hand:

    .venv/bin/python -m bench.notebook                # full: 1000 sources without, then with embeddings
    .venv/bin/python -m bench.notebook --quick        # smoke: 100 sources each
    .venv/bin/python -m bench.notebook --only text    # one phase: text (no embeddings) or vector
    .venv/bin/python bench/notebook.py --help

Each phase starts the notebook service (devtools.services.start: gunicorn, one
gevent worker, exactly as production) and its job worker (`python -m
app.notebook worker`, one job thread) on a fresh temporary DATA_DIR, talks to
127.0.0.1 only, prints figures and a verdict per target, and stops both whatever
happens. It asserts nothing and is never collected as a test.

Ingest: N text sources of 5 KB each (a made-up vocabulary with a Zipf-like
spread, so that BM25 has common and rare words to rank) are POSTed to /sources
as JSON with async_processing=true by C keep-alive clients (default 4); every
answer must be a 202. The clock runs from the first POST until the worker has
every command `completed` (polled through GET /commands?status=…, which counts
them), so the figure is sources per second to `completed`, the POSTs included.
Phase `text` adds the sources with embed=false (extraction, chunking, the FTS5
index); phase `vector` with embed=true (the local MiniLM model on the CPU, which
dominates).

Search: Q queries (default 500) of 1-3 words drawn from the vocabulary, one
client, sequential, each answer a 200: p50/p99 latency of POST /search for text
(phase text) and vector (phase vector; the first vector query, which loads the
model into the web worker, is timed apart). Targets (issue): text search p99
<= 50 ms and vector search p99 <= 200 ms at 1000 sources.
"""

from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import itertools  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/notebook.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    STOP_TIMEOUT_S,
    CpuMeter,
    HttpError,
    KeepAliveClient,
    Service,
    exit_on_sigterm,
    fmt_ms,
    percentile,
    print_targets,
    run_header,
)

PASSWORD = "bench-password"
AUTH = {"Authorization": f"Bearer {PASSWORD}"}
SOURCE_BYTES = 5 * 1024
TARGET_TEXT_P99_S = 0.050
TARGET_VECTOR_P99_S = 0.200

# Bounds: every wait below has one.
INGEST_DEADLINE_S = 3600.0  # all commands completed
WORKER_READY_S = 180.0  # the worker's model loaded (vector phase)
POLL_S = 0.5


def vocabulary(size, rng):
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "pa", "qu", "ri", "do", "fe", "gu"]
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def make_text(words, cumulative, rng):
    out, size = [], 0
    while size < SOURCE_BYTES:
        sentence = " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(8, 16))).capitalize() + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:SOURCE_BYTES]


class Stack:
    """The service and its job worker on one DATA_DIR."""

    def __init__(self, root, name, embed):
        self.data_dir = root / f"{name}-data"
        self.data_dir.mkdir()
        env = {"NOTEBOOK_PASSWORD": PASSWORD, "DATA_DIR": str(self.data_dir)}
        if not embed:  # no model load beside the text phase's ingest
            env["NOTEBOOK_EMBEDDING_PROVIDER"] = "none"
        self.worker_log = open(root / f"{name}-worker.log", "wb")
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "app.notebook", "worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self.worker_log,
            stderr=subprocess.STDOUT,
        )
        try:
            self.service = Service("notebook", self.data_dir, root / f"{name}-service.log", env=env)
        except BaseException:
            self.stop_worker()
            raise
        self.log_path = root / f"{name}-worker.log"

    def stop_worker(self):
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        self.worker_log.close()

    def stop(self):
        try:
            self.service.stop()
        finally:
            self.stop_worker()

    def wait_model(self):
        """Until the worker says its model is loaded (the vector phase measures
        ingest, not the model's load)."""
        deadline = time.monotonic() + WORKER_READY_S
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "embedding model ready" in text:
                return
            if "vector search is unavailable" in text or self.worker.poll() is not None:
                raise RuntimeError("the worker has no embedding model:\n" + text[-2000:])
            gevent.sleep(POLL_S)
        raise RuntimeError("the worker's model did not load in time")


def count(client, status):
    return client.json("GET", f"/commands?status={status}&limit=1", headers=AUTH)["total_count"]


def ingest(stack, texts, embed, clients):
    port = stack.service.port
    setup = KeepAliveClient(port)
    notebook = setup.json("POST", "/notebooks", {"name": f"bench {embed}"}, headers=AUTH, expect=(201,))["id"]
    queue = list(enumerate(texts))
    post_latencies, errors = [], Counter()
    meter = CpuMeter(stack.service.worker_pids + [stack.worker.pid]).start()
    started = time.perf_counter()

    def poster():
        client = KeepAliveClient(port)
        try:
            while queue:
                i, text = queue.pop()
                body = {
                    "type": "text",
                    "notebook_id": notebook,
                    "title": f"source {i}",
                    "content": text,
                    "async_processing": True,
                    "embed": embed,
                }
                t0 = time.perf_counter()
                try:
                    client.json("POST", "/sources", body, headers=AUTH, expect=(202,))
                    post_latencies.append(time.perf_counter() - t0)
                except (OSError, HttpError) as exc:
                    errors[str(exc)[:120]] += 1
        finally:
            client.close()

    gevent.joinall([gevent.spawn(poster) for _ in range(clients)])
    posted = time.perf_counter() - started
    deadline = time.monotonic() + INGEST_DEADLINE_S
    last = -1
    while time.monotonic() < deadline:
        done = count(setup, "completed")
        failed = count(setup, "failed")
        if done + failed >= len(post_latencies):
            break
        if done // 100 != last // 100:
            print(
                f"   … {done}/{len(post_latencies)} completed after {time.perf_counter() - started:.0f} s", flush=True
            )
        last = done
        gevent.sleep(POLL_S)
    elapsed = time.perf_counter() - started
    meter.stop()
    setup.close()
    return {
        "sources": len(texts),
        "completed": done,
        "failed": failed,
        "errors": errors,
        "posted_s": posted,
        "elapsed_s": elapsed,
        "rate": done / elapsed if elapsed else 0.0,
        "post_p50": percentile(post_latencies, 50),
        "post_p99": percentile(post_latencies, 99),
        "meter": meter,
        "notebook": notebook,
    }


def search_latency(stack, kind, queries):
    client = KeepAliveClient(stack.service.port)
    latencies, hits = [], 0
    first = None
    try:
        if kind == "health":  # the floor: an authenticated request that does no search
            for _ in queries:
                t0 = time.perf_counter()
                client.json("GET", "/notebooks?archived=true", headers=AUTH)
                latencies.append(time.perf_counter() - t0)
            return {
                "p50": percentile(latencies, 50),
                "p99": percentile(latencies, 99),
                "max": max(latencies),
                "n": len(latencies),
                "mean_hits": 0.0,
                "first": None,
            }
        if kind == "vector":  # the web worker loads the model on its first vector query
            t0 = time.perf_counter()
            client.json("POST", "/search", {"query": queries[0], "type": "vector", "limit": 10}, headers=AUTH)
            first = time.perf_counter() - t0
        for query in queries:
            t0 = time.perf_counter()
            answer = client.json(
                "POST", "/search", {"query": query, "type": kind, "limit": 10, "minimum_score": 0.0}, headers=AUTH
            )
            latencies.append(time.perf_counter() - t0)
            hits += answer["total_count"]
    finally:
        client.close()
    return {
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies),
        "n": len(latencies),
        "mean_hits": hits / len(latencies),
        "first": first,
    }


def print_ingest(label, result):
    meter = result["meter"]
    print(
        f"   {label}: {result['completed']}/{result['sources']} completed ({result['failed']} failed, "
        f"{sum(result['errors'].values())} POST errors) in {result['elapsed_s']:.1f} s = "
        f"{result['rate']:.1f} sources/s; POSTs took {result['posted_s']:.1f} s "
        f"(p50 {fmt_ms(result['post_p50'])}, p99 {fmt_ms(result['post_p99'])})"
    )
    print(
        f"   CPU: web + job worker {meter.pct(meter.worker)}, client {meter.pct(meter.client)}, "
        f"other {meter.pct(meter.other)}, stolen {meter.pct(meter.steal)}"
    )
    for error, n in result["errors"].most_common(3):
        print(f"   error x{n}: {error}")


def run_phase(root, name, texts, embed, queries, args):
    stack = Stack(root, name, embed)
    try:
        if embed:
            stack.wait_model()
        result = ingest(stack, texts, embed, args.clients)
        print_ingest(f"ingest ({'embed=true' if embed else 'embed=false'})", result)
        searches = {"floor": search_latency(stack, "health", queries), "text": search_latency(stack, "text", queries)}
        if embed:
            searches["vector"] = search_latency(stack, "vector", queries)
        for kind, figures in searches.items():
            extra = f", first query (model load) {figures['first']:.1f} s" if figures["first"] else ""
            label = "floor (GET /notebooks, no search)" if kind == "floor" else f"{kind} search"
            print(
                f"   {label} over {len(texts)} sources: {figures['n']} queries, p50 {fmt_ms(figures['p50'])}, "
                f"p99 {fmt_ms(figures['p99'])}, max {fmt_ms(figures['max'])}, "
                f"{figures['mean_hits']:.1f} hits/query{extra}"
            )
        return result, searches
    finally:
        stack.stop()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 sources per phase, 100 queries")
    parser.add_argument("--sources", type=int, default=None, help="sources per phase (default 1000)")
    parser.add_argument("--queries", type=int, default=None, help="search queries (default 500)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent posting clients")
    parser.add_argument("--only", choices=("text", "vector"), help="run one phase")
    parser.add_argument("--keep", action="store_true", help="keep the temporary DATA_DIRs")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    args.sources = args.sources or (100 if args.quick else 1000)
    args.queries = args.queries or (100 if args.quick else 500)
    return args


def main(argv=None):
    args = parse_args(argv)
    exit_on_sigterm()
    rng = random.Random(args.seed)
    words = vocabulary(4000, rng)
    cumulative = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    texts = [make_text(words, cumulative, rng) for _ in range(args.sources)]
    queries = [" ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(1, 3))) for _ in range(args.queries)]
    root = Path(tempfile.mkdtemp(prefix="bench-notebook-"))
    print(run_header("research notebook benchmark", args.quick))
    print(
        f"{args.sources} text sources of {SOURCE_BYTES} bytes per phase, {args.clients} posting clients, "
        f"{args.queries} search queries; data under {root}"
    )
    rows = []
    try:
        if args.only in (None, "text"):
            print("\n== Phase text: ingest without embeddings, text search ==")
            result, searches = run_phase(root, "text", texts, False, queries, args)
            rows.append(
                (f"ingest, embed=false ({args.sources} x 5 KB)", f"{result['rate']:.1f} sources/s", "figure", None)
            )
            rows.append(
                (
                    "text search p99",
                    fmt_ms(searches["text"]["p99"]),
                    "<= 50 ms",
                    searches["text"]["p99"] <= TARGET_TEXT_P99_S,
                )
            )
        if args.only in (None, "vector"):
            print("\n== Phase vector: ingest with embeddings (local MiniLM), text and vector search ==")
            result, searches = run_phase(root, "vector", texts, True, queries, args)
            rows.append(
                (f"ingest, embed=true ({args.sources} x 5 KB)", f"{result['rate']:.2f} sources/s", "figure", None)
            )
            rows.append(
                (
                    "text search p99 (same corpus)",
                    fmt_ms(searches["text"]["p99"]),
                    "<= 50 ms",
                    searches["text"]["p99"] <= TARGET_TEXT_P99_S,
                )
            )
            rows.append(
                (
                    "vector search p99",
                    fmt_ms(searches["vector"]["p99"]),
                    "<= 200 ms",
                    searches["vector"]["p99"] <= TARGET_VECTOR_P99_S,
                )
            )
    finally:
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("\n== Summary ==")
    print_targets(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
