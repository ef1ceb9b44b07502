"""Workspace apps benchmark: the path platform -> agent -> app beside the app itself. Run by hand:

    .venv/bin/python -m bench.workspace_apps            # full run (4 rounds of 5 s, 100 MB x 7)
    .venv/bin/python -m bench.workspace_apps --quick    # smoke run (2 rounds of 2 s, 100 MB x 2)

It starts, each in a process of its own: the test app (tests/support/workspace_app.py:
threaded http.server, HTTP/1.1 keep-alive), the workspace platform (devtools.services,
gunicorn, one gevent worker, as production) and a real agent (`python -m
app.workspace.agent`) connected to it, creates the first user and a workspace whose
agent declares the app, and waits until the agent is `connected`.

The reference a user would otherwise reach for: an SSH port forward (`ssh -L`, with a
terminal open as a user has it, so ssh sets TCP_NODELAY) through Debian's sshd on a
private loopback port, key-only (devtools/ssh_forward.py).

Phase 1, small GET: C keep-alive clients (default 8) send `GET /hello` (19 bytes)
back-to-back for S seconds, straight to the app, through
`/@owner/dev.main/apps/app/hello` with the session token (the platform checks
the token and the app, or finds them kept, and sends the request on a kept stream
of the agent's websocket: one connection from the agent to the app, as nginx keeps
its upstream connections), and through the SSH forward. A 2 s warm-up of each, not counted;
then rounds alternate the order (ABC, CBA). requests/s (all rounds, and the spread
of the rounds), p50/p99; the ratio is the platform's requests/s over the app's
(target >= 0.3), beside ssh's. CPU per request is split by hop: the platform's worker
(or ssh and sshd), and the rest of the path (agent and app, or the app).

Phase 2, bulk: one client downloads 100 MB (`GET /bytes?count=104857600`, Content-Length)
straight from the app, through the platform, through the SSH forward and through two
plain relays in a row (devtools/relays.py), reading into one reused buffer. One
warm-up download of each, then N of each, alternating; the median's MB/s of each, all
runs shown; the ratio of the medians (target >= 0.5). The two relays are the floor of
any path where two processes each receive every byte and send it on, as the
platform's worker and the agent do (nothing else in them: threads, recv_into and
sendall); the platform's figure beside theirs is what our framing, flow control and
HTTP cost on top.

Phase 3, the extra hop between workers (issue "agents on any worker"): the
platform as it scales out (REDIS_URL, a mesh secret, one database) twice, two
gunicorn masters of one worker each, the agent connected to the first. The same
small GETs and downloads go to the worker holding the agent and to the other one,
which carries each request over the mesh to the holder; the ratio of the two is
the hop's cost.

The clients run in this process on gevent and share the 2 CPUs with the platform,
the agent and the app (the bench client's CPU per request is printed: it is what the
path's processes could not use). Other work on the machine shows as "other"; a
round where it is large is named as disturbed. Asserts nothing; never a test.
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HOST,
    CpuMeter,
    KeepAliveClient,
    Service,
    build_request,
    exit_on_sigterm,
    fmt_ms,
    merge_rounds,
    print_targets,
    raise_nofile,
    run_header,
)
from bench.workspace import TOKEN_HEADER, create_first_user, run_clients  # noqa: E402
from devtools.redis_server import RedisServer  # noqa: E402
from devtools.relays import RelayChain  # noqa: E402
from devtools.services import free_port, terminate, wait_healthy  # noqa: E402
from devtools.ssh_forward import SshForward  # noqa: E402
from tests.support.workspace import agent_program  # noqa: E402

TARGET_RATIO = 0.3
TARGET_BULK_RATIO = 0.5
BULK_BYTES = 100 * 1024 * 1024
APP_PREFIX = "/@owner/dev.main/apps/app"
CONNECT_TIMEOUT_S = 30.0


class Stack:
    """The app, the platform and the agent, started together and stopped together."""

    def __init__(self, root, env=None, ssh=False):
        """`ssh`: an SSH forward to the app too (`self.ssh`), the reference, and two
        plain relays to it (`self.relays`), the floor of two hops."""
        self.processes = []
        self.service = self.ssh = self.relays = None
        try:
            self.app_port = free_port()
            self._spawn("app", [sys.executable, "-m", "tests.support.workspace_app", str(self.app_port)], root)
            wait_healthy(f"http://{HOST}:{self.app_port}/hello")
            data_dir = root / "platform-data"
            data_dir.mkdir()
            self.service = Service("workspace", data_dir, root / "platform.log", env=env)
            self.token = create_first_user(self.service.port, f"{HOST}:{self.service.port}")
            agent = self._create_workspace()
            env = {**os.environ, "WORKSPACE_AGENT_TOKEN": agent["token"]}
            self.agent_pid = self._spawn(
                "agent", [*agent_program(), "agent", "--url", f"http://{HOST}:{self.service.port}"], root, env
            ).pid
            self._wait_connected(agent["id"])
            if ssh:
                self.ssh = SshForward(root / "ssh", self.app_port).start()
                self.relays = RelayChain(root, self.app_port).start()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name, command, root, env=None):
        log = open(root / f"{name}.log", "wb")
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((process, log))
        return process

    def _create_workspace(self):
        client = KeepAliveClient(self.service.port)
        try:
            body = {
                "name": "dev",
                "agents": [{"name": "main", "apps": [{"slug": "app", "url": f"http://{HOST}:{self.app_port}"}]}],
            }
            return client.json("POST", "/api/v2/users/me/workspaces", body, {TOKEN_HEADER: self.token}, expect=(201,))[
                "agents"
            ][0]
        finally:
            client.close()

    def _wait_connected(self, agent_id):
        client = KeepAliveClient(self.service.port)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                agent = client.json("GET", f"/api/v2/workspaceagents/{agent_id}", headers={TOKEN_HEADER: self.token})
                if agent["status"] == "connected":
                    return
                gevent.sleep(0.1)  # polling with a deadline
        finally:
            client.close()
        raise RuntimeError(f"the agent did not connect within {CONNECT_TIMEOUT_S} s")

    def stop(self):
        for forward in (self.ssh, self.relays):
            if forward is not None:
                forward.stop()
        self.ssh = self.relays = None
        for process, log in reversed(self.processes):
            try:
                terminate(process, 10)
            except subprocess.TimeoutExpired:
                pass
            log.close()
        self.processes = []
        if self.service is not None:
            self.service.stop()
            self.service = None


# --------------------------------------------------------------------------- phase 1: small GETs


def platform_request(port, token):
    return build_request("GET", APP_PREFIX + "/hello", f"{HOST}:{port}", {TOKEN_HEADER: token})


def run_small(args, stack):
    print(
        f"\n== Small GET: {args.clients} keep-alive clients, {args.rounds} rounds x {args.seconds:g} s ==", flush=True
    )
    ways = {
        "app": (stack.app_port, build_request("GET", "/hello", f"{HOST}:{stack.app_port}")),
        "platform": (stack.service.port, platform_request(stack.service.port, stack.token)),
        "ssh -L": (stack.ssh.port, build_request("GET", "/hello", f"{HOST}:{stack.app_port}")),
    }
    app_pid = stack.processes[0][0].pid
    # "worker" is the first hop (the process the bench's request reaches), "proxy" the rest.
    meters = {
        "app": lambda: CpuMeter([app_pid]),
        "platform": lambda: CpuMeter(stack.service.worker_pids, [stack.agent_pid, app_pid]),
        "ssh -L": lambda: CpuMeter(stack.ssh.pids(), [app_pid]),
    }
    return small_rounds(args, ways, meters)


def alternating(ways, round_index):
    """The order of `ways` in a round: as given, then reversed (ABC, CBA, ...), so that
    drift over the run falls evenly on each."""
    order = list(ways)
    return order if round_index % 2 == 0 else order[::-1]


def small_rounds(args, ways, meters):
    """Warm-up, then rounds of the `ways` ({name: (port, request)}) in alternating
    order; the figures of each, printed."""
    for way, (port, raw) in ways.items():  # warm-up, not counted
        run_clients(port, raw, args.clients, 2.0, meters[way]())
    segments = {way: [] for way in ways}
    for r in range(args.rounds):
        for way in alternating(ways, r):
            port, raw = ways[way]
            segment = run_clients(port, raw, args.clients, args.seconds, meters[way]())
            segments[way].append(segment)
            cpu, count = segment["cpu"], max(1, segment["count"])
            print(
                f"   round {r + 1} {way:<9} {segment['rate']:7.0f} req/s  p99 "
                f"{fmt_ms(merge_rounds([segment])['p99'])}  answers {dict(segment['statuses'])}  "
                f"CPU/req {cpu.worker / count * 1e6:.0f} us + rest of path {cpu.proxy / count * 1e6:.0f} us, "
                f"client {cpu.client / count * 1e6:.0f} us, other {cpu.other / count * 1e6:.0f} us",
                flush=True,
            )
    figures = {way: merge_rounds(parts) for way, parts in segments.items()}
    for way, figure in figures.items():
        rates = figure["rates"]
        print(
            f"   {way:<9} {figure['rate']:7.0f} req/s (rounds {min(rates):.0f}..{max(rates):.0f}), "
            f"p50 {fmt_ms(figure['p50'])}, p99 {fmt_ms(figure['p99'])}; CPU per request: "
            + (
                f"app {figure['worker_per_req'] * 1e6:.0f} us"
                if way == "app"
                else f"{'ssh and sshd' if way == 'ssh -L' else 'platform worker(s)'} "
                f"{figure['worker_per_req'] * 1e6:.0f} us, rest of the path {figure['proxy_per_req'] * 1e6:.0f} us"
            )
            + f"; bench client {figure['client_per_req'] * 1e6:.0f} us; answers {dict(figure['statuses'])}"
            + (f"; disturbed rounds {figure['disturbed_rounds']}" if figure["disturbed_rounds"] else "")
        )
    return figures


# --------------------------------------------------------------------------- phase 2: bulk


def download(port, path, headers):
    """Seconds to download `path` (Content-Length) into one reused buffer; checks the length."""
    sock = socket.create_connection((HOST, port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    started = time.perf_counter()
    try:
        sock.sendall(build_request("GET", path, f"{HOST}:{port}", headers))
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed before the answer's head")
            head += data
        head, body_start = head.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        length = int(
            next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        )
        if status != 200 or length != BULK_BYTES:
            raise RuntimeError(f"answer {status} with {length} bytes")
        received, buffer = len(body_start), bytearray(1024 * 1024)
        while received < length:
            count = sock.recv_into(buffer)
            if not count:
                raise ConnectionError(f"closed after {received} of {length} bytes")
            received += count
        return time.perf_counter() - started
    finally:
        sock.close()


def run_bulk(args, stack):
    print(f"\n== Bulk: {BULK_BYTES // (1024 * 1024)} MB download x {args.downloads}, one client ==", flush=True)
    path = f"/bytes?count={BULK_BYTES}"
    return bulk_rounds(
        args,
        {
            "app": (stack.app_port, path, None),
            "platform": (stack.service.port, APP_PREFIX + path, {TOKEN_HEADER: stack.token}),
            "ssh -L": (stack.ssh.port, path, None),
            "2 relays": (stack.relays.port, path, None),
        },
    )


def bulk_rounds(args, ways):
    for port, target, headers in ways.values():  # warm-up, not counted
        download(port, target, headers)
    times = {way: [] for way in ways}
    for r in range(args.downloads):  # alternating, as the small GETs
        for way in alternating(ways, r):
            times[way].append(download(*ways[way]))
    speeds = {}
    for way, runs in times.items():
        runs.sort()
        median = runs[len(runs) // 2]
        speeds[way] = BULK_BYTES / median / 1e6
        print(
            f"   {way:<9} median {median:.3f} s = {speeds[way]:.0f} MB/s (runs "
            + ", ".join(f"{BULK_BYTES / t / 1e6:.0f}" for t in runs)
            + " MB/s)",
            flush=True,
        )
    return speeds


# --------------------------------------------------------------------------- phase 3: the hop between workers


def run_hop(args, root):
    print(
        "\n== The extra hop: the worker holding the agent, and another worker that carries each request to it ==",
        flush=True,
    )
    with RedisServer() as redis_server:
        hop_root = root / "hop"
        hop_root.mkdir()
        env = {
            "REDIS_URL": redis_server.new_url(),
            "WORKSPACE_MESH_SECRET": "the bench's mesh secret",
            "DATABASE_URL": f"sqlite:///{hop_root}/workspace.db",
        }
        stack = Stack(hop_root, env)
        other = None
        try:
            other_data = hop_root / "other-data"
            other_data.mkdir()
            other = Service("workspace", other_data, hop_root / "other.log", env=env)
            app_pid = stack.processes[0][0].pid
            ports = {"holder": stack.service.port, "other": other.port}
            requests = {way: (port, platform_request(port, stack.token)) for way, port in ports.items()}
            small = small_rounds(
                args,
                requests,
                {
                    "holder": lambda: CpuMeter(stack.service.worker_pids, [stack.agent_pid, app_pid]),
                    "other": lambda: CpuMeter(
                        other.worker_pids, [*stack.service.worker_pids, stack.agent_pid, app_pid]
                    ),
                },
            )
            path = APP_PREFIX + f"/bytes?count={BULK_BYTES}"
            bulk = bulk_rounds(args, {way: (port, path, {TOKEN_HEADER: stack.token}) for way, port in ports.items()})
        finally:
            if other is not None:
                other.stop()
            stack.stop()
    return small, bulk


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    args.rounds, args.seconds, args.downloads = (2, 2.0, 2) if args.quick else (4, 5.0, 7)
    exit_on_sigterm()
    raise_nofile()
    print(run_header("Workspace apps benchmark", args.quick))
    with tempfile.TemporaryDirectory(prefix="bench-workspace-apps-") as directory:
        stack = Stack(Path(directory), ssh=True)
        try:
            small = run_small(args, stack)
            bulk = run_bulk(args, stack)
        finally:
            stack.stop()
        hop_small, hop_bulk = run_hop(args, Path(directory))
    ratio = small["platform"]["rate"] / small["app"]["rate"] if small["app"]["rate"] else 0.0
    bulk_ratio = bulk["platform"] / bulk["app"] if bulk["app"] else 0.0
    ssh_ratio = small["ssh -L"]["rate"] / small["app"]["rate"] if small["app"]["rate"] else 0.0
    ssh_bulk_ratio = bulk["ssh -L"] / bulk["app"] if bulk["app"] else 0.0
    hop_small_ratio = hop_small["other"]["rate"] / hop_small["holder"]["rate"] if hop_small["holder"]["rate"] else 0.0
    floor_ratio = bulk["2 relays"] / bulk["app"] if bulk["app"] else 0.0
    of_floor = bulk["platform"] / bulk["2 relays"] if bulk["2 relays"] else 0.0
    hop_bulk_ratio = hop_bulk["other"] / hop_bulk["holder"] if hop_bulk["holder"] else 0.0
    print("\n== Summary ==")
    print_targets(
        [
            (
                "small GET req/s, platform / app",
                f"{ratio:.2f} ({small['platform']['rate']:.0f} / {small['app']['rate']:.0f})",
                f">= {TARGET_RATIO}",
                ratio >= TARGET_RATIO,
            ),
            (
                "small GET req/s, ssh -L / app (the reference)",
                f"{ssh_ratio:.2f} ({small['ssh -L']['rate']:.0f} / {small['app']['rate']:.0f})",
                "-",
                None,
            ),
            (
                "small GET p99, platform / ssh -L / app",
                f"{fmt_ms(small['platform']['p99'])} / "
                f"{fmt_ms(small['ssh -L']['p99'])} / {fmt_ms(small['app']['p99'])}",
                "-",
                None,
            ),
            (
                "100 MB download, platform / app",
                f"{bulk_ratio:.2f} ({bulk['platform']:.0f} / {bulk['app']:.0f} MB/s)",
                f">= {TARGET_BULK_RATIO}",
                bulk_ratio >= TARGET_BULK_RATIO,
            ),
            (
                "100 MB download, ssh -L / app (the reference)",
                f"{ssh_bulk_ratio:.2f} ({bulk['ssh -L']:.0f} / {bulk['app']:.0f} MB/s)",
                "-",
                None,
            ),
            (
                "100 MB download, 2 plain relays / app (the floor)",
                f"{floor_ratio:.2f} ({bulk['2 relays']:.0f} / {bulk['app']:.0f} MB/s)",
                "-",
                None,
            ),
            (
                "100 MB download, platform / 2 plain relays",
                f"{of_floor:.2f} ({bulk['platform']:.0f} / {bulk['2 relays']:.0f} MB/s)",
                "-",
                None,
            ),
            (
                "small GET req/s, other worker / holder",
                f"{hop_small_ratio:.2f} ({hop_small['other']['rate']:.0f} / {hop_small['holder']['rate']:.0f})",
                "-",
                None,
            ),
            (
                "100 MB download, other worker / holder",
                f"{hop_bulk_ratio:.2f} ({hop_bulk['other']:.0f} / {hop_bulk['holder']:.0f} MB/s)",
                "-",
                None,
            ),
        ]
    )
    print(
        json.dumps(
            {
                "small_ratio": round(ratio, 3),
                "bulk_ratio": round(bulk_ratio, 3),
                "ssh_small_ratio": round(ssh_ratio, 3),
                "ssh_bulk_ratio": round(ssh_bulk_ratio, 3),
                "relays_bulk_ratio": round(floor_ratio, 3),
                "bulk_of_relays": round(of_floor, 3),
                "hop_small_ratio": round(hop_small_ratio, 3),
                "hop_bulk_ratio": round(hop_bulk_ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
