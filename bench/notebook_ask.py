"""Ask benchmark: many concurrent `POST /ask` streams on one gevent worker, the
model provider answering at once. Run by hand:

    .venv/bin/python -m bench.notebook_ask             # 200 streams at once, 3 rounds
    .venv/bin/python -m bench.notebook_ask --streams 50 --rounds 1

It starts the fake providers (`python -m devtools.fake_providers serve` on
127.0.0.3), the notebook service (gunicorn, one gevent worker, as production) and
its job worker on a fresh DATA_DIR, registers the fake OpenAI-compatible model as
the default chat model, adds one text source, then opens N streams at once.

The figure of the issue: our own overhead per stream, from the provider's first
byte of the strategy call (timestamped by the fake when it sends its head) to the
first record (`strategy`) reaching this client; target p99 <= 20 ms. Also: every
stream's whole duration, records per stream, failures, and the worker's CPU. It
asserts nothing and is never collected as a test.
"""
from gevent import monkey

monkey.patch_all()

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import requests  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/notebook_ask.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    STOP_TIMEOUT_S, CpuMeter, Service, exit_on_sigterm, fmt_ms, percentile, print_targets, raise_nofile,
    run_header)
from devtools.services import free_port, terminate, wait_healthy  # noqa: E402

PASSWORD = "bench-password"
AUTH = {"Authorization": f"Bearer {PASSWORD}"}
PROVIDER_HOST = "127.0.0.3"
TARGET_OVERHEAD_P99_S = 0.020
STREAM_TIMEOUT_S = 120.0
ENCRYPTION_KEY = "9vK3oqyJ1a7h0d8V2bqQm6YQ5bQ0m0n1R2j4b7c8d9E="


class Stack:
    """Fake providers, the service and its job worker."""

    def __init__(self, root):
        self.fake_port = free_port()
        self.fake_log = open(root / "fake.log", "wb")
        self.fake = subprocess.Popen([sys.executable, "-m", "devtools.fake_providers", "serve", "--host",
                                      PROVIDER_HOST, "--port", str(self.fake_port)], cwd=ROOT,
                                     stdout=self.fake_log, stderr=subprocess.STDOUT)
        self.fake_url = f"http://{PROVIDER_HOST}:{self.fake_port}"
        data_dir = root / "data"
        data_dir.mkdir()
        env = {"NOTEBOOK_PASSWORD": PASSWORD, "DATA_DIR": str(data_dir), "NOTEBOOK_EMBEDDING_PROVIDER": "none",
               "NOTEBOOK_ENCRYPTION_KEY": ENCRYPTION_KEY, "NOTEBOOK_MODEL_HOST_ALLOWLIST": f"{PROVIDER_HOST}/32"}
        self.worker_log = open(root / "worker.log", "wb")
        self.worker = subprocess.Popen([sys.executable, "-m", "app.notebook", "worker"], cwd=ROOT,
                                       env={**os.environ, **env}, stdout=self.worker_log, stderr=subprocess.STDOUT)
        self.service = Service("notebook", data_dir, root / "service.log", env=env)
        self.url = f"http://127.0.0.1:{self.service.port}"
        wait_healthy(self.fake_url + "/_seen", timeout=10)

    def call(self, method, path, **kwargs):
        response = requests.request(method, self.url + path, headers=AUTH, timeout=60, **kwargs)
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def stop(self):
        try:
            self.service.stop()
        finally:
            for process, log in ((self.worker, self.worker_log), (self.fake, self.fake_log)):
                terminate(process, STOP_TIMEOUT_S)
                log.close()


def prepare(stack):
    credential = stack.call("POST", "/credentials", json={"name": "fake", "provider": "openai_compatible",
                                                          "base_url": stack.fake_url + "/v1"})
    model = stack.call("POST", "/models", json={"name": "fake-chat", "provider": "openai_compatible",
                                                "type": "language", "credential": credential["id"]})
    stack.call("POST", "/models/config", json={"default_chat_model": model["id"]})
    notebook = stack.call("POST", "/notebooks", json={"name": "bench", "description": ""})["id"]
    stack.call("POST", "/sources", json={"type": "text", "notebook_id": notebook,
                                         "content": "Glaciers carve valleys. Moraines mark where they ended."})
    return notebook


def one_stream(stack, notebook, question, out):
    """One /ask over a plain socket (HTTP/1.0: the stream ends with the connection),
    timing when the first `data:` record arrives: a lean client, so that its own
    parsing is not what the figure measures."""
    body = json.dumps({"question": question, "notebook_id": notebook}).encode()
    head = (f"POST /ask HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {PASSWORD}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    started, first, received = time.time(), None, bytearray()
    try:
        with socket.create_connection(("127.0.0.1", stack.service.port), timeout=STREAM_TIMEOUT_S) as sock:
            sock.sendall(head + body)
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
                if first is None and b"\ndata: " in received:
                    first = time.time()
    except OSError as exc:
        out[question] = {"error": type(exc).__name__}
        return
    if not received.startswith(b"HTTP/1.1 200") and not received.startswith(b"HTTP/1.0 200"):
        out[question] = {"error": received[:40].decode(errors="replace")}
        return
    kinds = [json.loads(line[6:])["type"] for line in received.decode().split("\n") if line.startswith("data: ")]
    out[question] = {"first": first, "seconds": time.time() - started, "kinds": kinds}


def first_bytes(stack):
    """{question: the fake's first-byte time of its strategy call}."""
    seen = requests.get(stack.fake_url + "/_seen", timeout=60).json()
    times = {}
    for entry in seen:
        messages = (entry.get("body") or {}).get("messages") or []
        if len(messages) == 2 and '"searches"' in messages[0]["content"]:
            times[messages[1]["content"]] = entry["first_byte"]
    return times


def run_round(stack, notebook, streams, number):
    requests.post(stack.fake_url + "/_reset", timeout=10)
    questions = [f"How do glaciers carve valleys? (round {number}, stream {i})" for i in range(streams)]
    out = {}
    meter = CpuMeter(stack.service.worker_pids).start()
    gevent.joinall([gevent.spawn(one_stream, stack, notebook, q, out) for q in questions],
                   timeout=STREAM_TIMEOUT_S + 10)
    meter.stop()
    provider = first_bytes(stack)
    overheads = [out[q]["first"] - provider[q] for q in questions
                 if q in provider and out.get(q, {}).get("first") and provider[q]]
    complete = [o for o in out.values() if o.get("kinds", [])[-1:] == ["complete"]]
    failures = [o.get("error") or o.get("kinds") for o in out.values() if o not in complete]
    return {"overheads": overheads, "seconds": [o["seconds"] for o in complete], "complete": len(complete),
            "failures": failures + ["no answer"] * (streams - len(out)), "cpu": meter,
            "records": sorted({len(o["kinds"]) for o in complete})}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.notebook_ask", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    raise_nofile()
    print(run_header(f"notebook ask: {args.streams} concurrent streams, one gevent worker", False))
    with tempfile.TemporaryDirectory(prefix="bench-notebook-ask-") as tmp:
        stack = Stack(Path(tmp))
        try:
            notebook = prepare(stack)
            run_round(stack, notebook, min(10, args.streams), 0)  # warm up: connections, caches
            overheads, seconds, failures = [], [], []
            for number in range(1, args.rounds + 1):
                result = run_round(stack, notebook, args.streams, number)
                overheads += result["overheads"]
                seconds += result["seconds"]
                failures += result["failures"]
                cpu = result["cpu"]
                print(f"   round {number}: {result['complete']}/{args.streams} complete in {cpu.seconds:.2f} s, "
                      f"records per stream {result['records']}, overhead p50 "
                      f"{fmt_ms(percentile(result['overheads'], 50))} p99 {fmt_ms(percentile(result['overheads'], 99))}, "
                      f"worker CPU {cpu.pct(cpu.worker)}, other {cpu.pct(cpu.other)}"
                      f"{' (disturbed)' if cpu.disturbed() else ''}")
        finally:
            stack.stop()
    p99 = percentile(overheads, 99)
    print(f"   streams: {len(seconds)} complete, {len(failures)} failed {failures[:3] if failures else ''}")
    print(f"   whole stream: p50 {fmt_ms(percentile(seconds, 50))}, p99 {fmt_ms(percentile(seconds, 99))}")
    print_targets([("overhead per stream p99 (provider's first byte -> first record)", fmt_ms(p99),
                    f"<= {fmt_ms(TARGET_OVERHEAD_P99_S)}", p99 is not None and p99 <= TARGET_OVERHEAD_P99_S and
                    not failures)])
    return 0 if p99 is not None and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
