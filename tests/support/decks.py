"""The deck service's test support: the sample deck copied into a DATA_DIR, small
helpers (file trees, PNGs, events), a session's SSE stream read in a thread, and
connections and streams on chosen gunicorn workers."""

import base64
import http.client
import json
import os
import shutil
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from app.common.sse_client import iter_records
from devtools.worker_sockets import worker_holding
from tests.support.shared import ROOT

SAMPLE_DECK = ROOT / "samples" / "decks" / "welcome"


def copy_sample_deck(data_dir, name="welcome"):
    """The sample deck's sources under DATA_DIR/sources/<name>; returns the import body."""
    target = Path(data_dir) / "sources" / name
    shutil.copytree(SAMPLE_DECK, target)
    return {"id": name, "md_path": f"sources/{name}/deck.md", "copy_from": f"sources/{name}"}


def decks_with_sample(starter, data_dir):
    """A deck service started by `starter` on `data_dir`, whose sources hold the sample
    deck (not yet imported): `service.import_body` imports it."""
    data_dir.mkdir()
    body = copy_sample_deck(data_dir)
    service = starter("decks", data_dir=data_dir)
    service.import_body = body
    return service


def tree(root):
    """Every path below `root` with its size and mtime: to prove nothing changed."""
    found = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(current, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def png_bytes(width=4, height=3):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode()


def post_event(base_url, session_id, event, timeout=10):
    return requests.post(f"{base_url}/api/sessions/{session_id}/events", json=event, timeout=timeout)


def read_log(data_dir, session_id):
    with open(os.path.join(data_dir, "sessions", session_id, "events.jsonl"), "rb") as f:
        return f.read()


# ---------------------------------------------------------------- a session's stream


class StreamReader(threading.Thread):
    """Reads `url` until it has seen seq `until` (or the stream ends), keeping
    every record and comment; `.connected` is set once the response is open."""

    def __init__(self, url, until=None, headers=None, comments=False):
        super().__init__(daemon=True)
        self.url, self.until, self.headers, self.comments = url, until, headers or {}, comments
        self.seqs, self.events, self.comment_lines = [], [], []
        self.connected = threading.Event()
        self.response = None
        self.local_port = None  # the client's port: which worker serves it (worker_holding)
        self.error = None

    def run(self):
        try:
            with requests.get(self.url, headers=self.headers, stream=True, timeout=(5, 60)) as response:
                self.response = response
                self.local_port = response.raw.connection.sock.getsockname()[1]
                self.connected.set()
                for record in iter_records(response, include_comments=True):
                    if record.comment is not None:
                        self.comment_lines.append(record.comment)
                        continue
                    event = record.json()
                    assert int(record.id) == event["seq"]
                    self.seqs.append(event["seq"])
                    self.events.append(event)
                    if self.until is not None and event["seq"] >= self.until:
                        return
        except Exception as exc:  # reported by the test through .error
            self.error = exc
        finally:
            self.connected.set()

    def wait_open(self, timeout=10):
        """Until the server sent its first bytes (the ': stream open' comment)."""
        assert self.connected.wait(timeout), "stream did not connect"


# ------------------------------------------------- connections on chosen workers
# A test that needs a stream on one worker and a post through another opens
# connections until the kernel (devtools.worker_sockets) says the wanted worker
# accepted one.


def connection_on(service, pid, attempts=200):
    """A fresh HTTP connection (http.client) that worker `pid` accepted."""
    for _ in range(attempts):
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
        connection.connect()
        if worker_holding(service, connection.sock.getsockname()[1]) == pid:
            return connection
        connection.close()
    raise AssertionError(f"worker {pid} accepted none of {attempts} connections")


def post_event_on(service, pid, session_id, event):
    """POST `event` through worker `pid`; returns the stored event."""
    connection = connection_on(service, pid)
    try:
        connection.request(
            "POST",
            f"/api/sessions/{session_id}/events",
            body=json.dumps(event),
            headers={"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    assert response.status == 201, body
    return json.loads(body)


def streams_on_every_worker(service, url, until, attempts=60):
    """Started StreamReaders of `url` until every worker holds at least one:
    {worker pid: [readers]}."""
    pids = service.worker_pids()
    by_worker = {pid: [] for pid in pids}
    for _ in range(attempts):
        reader = StreamReader(url, until=until)
        reader.start()
        reader.wait_open()
        assert reader.error is None and reader.local_port, reader.error
        by_worker.setdefault(worker_holding(service, reader.local_port), []).append(reader)
        if all(by_worker[pid] for pid in pids):
            return by_worker
    raise AssertionError(f"streams did not reach every worker: { {p: len(r) for p, r in by_worker.items()} }")


# ------------------------------------------------- requests from chosen addresses
# nginx limits per client address; every 127.0.0.x is this machine, so a test speaks
# to nginx (listening on 127.0.0.1) from as many client addresses as it needs.


def connection_from(port, address, timeout=30):
    """An HTTP connection to 127.0.0.1:`port` whose client address is `address` (127.0.0.x)."""
    return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(address, 0))


def request_from(port, address, method, path, host, body=None, headers=None):
    """(status, headers, body bytes) of one request sent from `address`; `body` is JSON."""
    connection = connection_from(port, address)
    try:
        head = {"Host": host, **({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        connection.request(method, path, body=None if body is None else json.dumps(body), headers=head)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def burst_until_refused(send, batch=30, threads=10, batches=20):
    """Statuses of `send()` called in concurrent batches until one answers 429; the
    limits are per second, so a burst of concurrent requests passes them however fast
    this machine is."""
    answers = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(batches):
            answers += pool.map(lambda _: send(), range(batch))
            if any(answer[0] == 429 for answer in answers):
                return answers
    raise AssertionError(f"{len(answers)} requests and never a 429")
