"""Which gunicorn worker holds a connection. A test that needs a stream on one
worker and a post through another asks the kernel (/proc) instead of hoping that
the accepts spread: the server side of a loopback TCP connection is a socket inode
in /proc/net/tcp, and the worker that accepted it holds that inode among its fds."""
import http.client
import json
import os

from devtools.waiting import wait_for
from tests.decks.streams import StreamReader


def _socket_inodes(pid):
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def _server_side_inode(server_port, client_port):
    """The inode of the accepted socket of the connection from `client_port`, or 0."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
            if int(local, 16) == server_port and int(remote, 16) == client_port and int(fields[9]):
                return int(fields[9])
    return 0


def worker_of(service, client_port, timeout=10):
    """The pid of the worker that accepted the connection from `client_port`."""
    def find():
        inode = _server_side_inode(service.port, client_port)
        if inode:
            for pid in service.worker_pids():
                if inode in _socket_inodes(pid):
                    return pid
        return None
    return wait_for(find, f"a worker accepting the connection from port {client_port}", timeout)


def connection_on(service, pid, attempts=200):
    """A fresh HTTP connection (http.client) that worker `pid` accepted."""
    for _ in range(attempts):
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
        connection.connect()
        if worker_of(service, connection.sock.getsockname()[1]) == pid:
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
        by_worker.setdefault(worker_of(service, reader.local_port), []).append(reader)
        if all(by_worker[pid] for pid in pids):
            return by_worker
    raise AssertionError(f"streams did not reach every worker: { {p: len(r) for p, r in by_worker.items()} }")
