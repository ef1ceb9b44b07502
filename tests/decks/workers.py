"""Connections and streams on chosen gunicorn workers of the deck service: a test
that needs a stream on one worker and a post through another opens connections
until the kernel (devtools.worker_sockets) says the wanted worker accepted one."""
import http.client
import json

from devtools.worker_sockets import worker_holding
from tests.decks.streams import StreamReader


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
        connection.request("POST", f"/api/sessions/{session_id}/events", body=json.dumps(event),
                           headers={"Content-Type": "application/json"})
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
