"""Two plain TCP relays in a row, the floor for the workspace apps tunnel's bulk figure:
the path client -> platform worker -> agent -> app has two processes that each receive
every byte and send it on, and so does this one, with nothing else in it (no framing,
no flow control, no HTTP). Whatever the tunnel costs above it is ours; what it costs
below the direct path is the two hops' kernel work, which no relaying design avoids.

    with RelayChain(folder, app_port) as relays:
        relays.port        # connect here to reach 127.0.0.1:<app_port> through both
        relays.pids()      # the relays' processes

Each relay is this file run as a program, `python -m devtools.relays LISTEN TARGET`:
a thread per direction of each connection, blocking `recv_into` one reused buffer
of the tunnel's frame size and `sendall` of what came, TCP_NODELAY both ways, an end
of input passed on as a half-close. Not app code.
"""

import socket
import subprocess
import sys
import threading
from pathlib import Path

from devtools.services import ProcessGroup, accepts, free_port
from devtools.waiting import wait_for

BUFFER_BYTES = 512 * 1024  # workspace_protocol.mux.MAX_DATA: the tunnel's unit too
ROOT = Path(__file__).resolve().parents[1]


class RelayChain(ProcessGroup):
    """`hops` relays: the first listens on `port`, the last dials the app."""

    def __init__(self, folder, target_port, hops=2):
        super().__init__()
        self.folder, self.target_port, self.hops = Path(folder), target_port, hops
        self.port = None

    def start(self):
        target = self.target_port
        try:
            for hop in range(self.hops):  # from the app outwards
                listen = free_port()
                log = open(self._log_path(hop), "wb")
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "devtools.relays", str(listen), str(target)],
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
                log.close()
                wait_for(lambda port=listen: self._listening(port), f"the relay on port {listen}", timeout=30)
                target = listen
        except BaseException:
            self.stop()
            raise
        self.port = target
        return self

    def _listening(self, port):
        if self.processes[-1].poll() is not None:
            log = self._log_path(len(self.processes) - 1)
            raise RuntimeError("a relay exited: " + log.read_text(errors="replace")[-1000:])
        return accepts(port)

    def _log_path(self, hop):
        return self.folder / f"relay-{hop}.log"

    def pids(self):
        return [process.pid for process in self.processes]


# --------------------------------------------------------------------------- the relay program


def _pump(source, target):
    buffer = bytearray(BUFFER_BYTES)
    view = memoryview(buffer)
    try:
        while True:
            count = source.recv_into(buffer)
            if not count:
                break
            target.sendall(view[:count])
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _serve(client, target_port):
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port))
    except OSError:
        client.close()
        return
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(listen_port, target_port):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(128)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve, args=(client, target_port), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
