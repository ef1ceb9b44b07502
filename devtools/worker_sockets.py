"""Which gunicorn worker holds a TCP connection, asked of the kernel (Linux /proc).

The workers of a service share one listening socket, and the kernel hands each new
connection to whichever worker accepts first: a client cannot choose its worker,
and a few connections need not spread over them at all. Tests that need a stream on
one worker and a post through another (and the deck bench, which spreads its
streams evenly) therefore ask the kernel instead of hoping the accepts spread. On
loopback both ends of a connection are in this machine's /proc/net/tcp (or tcp6):
the row whose local port is the service's and whose remote port is the client's
names the inode of the accepted socket, and the worker that accepted it holds
`socket:[inode]` among its file descriptors (/proc/<pid>/fd)."""

import os
from collections import namedtuple

from devtools.waiting import wait_for

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")

TcpSocket = namedtuple("TcpSocket", "local_port remote_port rx_queue inode")
TcpSocket.__doc__ = """One row of /proc/net/tcp[6]: its ports, the bytes received and
not yet read by its owner, and its inode (0 when no process holds it, e.g. TIME_WAIT)."""


def _port(address):
    return int(address.rsplit(":", 1)[1], 16)  # "0100007F:1F90", or 32 hex digits for IPv6


def tcp_sockets():
    """The TCP sockets of this machine (IPv4 and IPv6), as TcpSockets."""
    found = []
    for table in TABLES:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]  # past the header
        except OSError:
            continue  # no IPv6
        for row in rows:
            fields = row.split()  # sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode ...
            found.append(
                TcpSocket(_port(fields[1]), _port(fields[2]), int(fields[4].split(":")[1], 16), int(fields[9]))
            )
    return found


def socket_inodes(pid):
    """The inodes of the sockets among the open files of process `pid` (none if it is gone)."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def server_socket_inode(server_port, client_port):
    """The inode of the server side of the loopback connection from `client_port` to
    `server_port`, or 0 while there is none (not accepted yet, or closed)."""
    for sock in tcp_sockets():
        if sock.local_port == server_port and sock.remote_port == client_port and sock.inode:
            return sock.inode
    return 0


def worker_holding(service, client_port, timeout=10):
    """The pid of the worker of `service` (a devtools.services.RunningService) that
    accepted the connection from `client_port`, waiting up to `timeout` s for it."""

    def holder():
        inode = server_socket_inode(service.port, client_port)
        return inode and next((pid for pid in service.worker_pids() if inode in socket_inodes(pid)), None)

    return wait_for(holder, f"a worker holding the connection from port {client_port}", timeout)


def connection_workers(server_port, pids):
    """{client port: worker pid} of the connections to `server_port` that one of the
    workers `pids` has accepted, in one read of the tables (for many connections at once)."""
    owner = {inode: pid for pid in pids for inode in socket_inodes(pid)}
    return {
        sock.remote_port: owner[sock.inode]
        for sock in tcp_sockets()
        if sock.local_port == server_port and sock.remote_port and sock.inode in owner
    }
