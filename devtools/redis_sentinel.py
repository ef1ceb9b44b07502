"""Redis with Sentinel for tests and benches: a master, its replicas and three real
`redis-sentinel` processes on loopback, one password for all of them (as the data role
configures it), each in a temporary folder with a config file that the sentinels
rewrite at a failover (as they do on a data host).

    with SentinelSet(replicas=1) as redis_set:
        url = redis_set.url(db=3)    # redis+sentinel://:<password>@127.0.0.1:<p1>,...,/bundle/3
        old = redis_set.master_address()
        redis_set.kill_master()          # SIGKILL: the host is gone, its connections reset
        redis_set.wait_for_failover(old) # every sentinel names a replica that says it is master

Faults: `kill_master()`; `frozen_master()` (SIGSTOP, a host gone without FIN or RST,
then SIGCONT); `failover()` (SENTINEL FAILOVER, an admin's planned one);
`writes_lost_in_failover()` (the writes made inside reach no replica, then the master
is killed: what asynchronous replication loses). Every wait is for a condition the
sentinels or the servers report, never for a guessed time.
"""

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from devtools.services import free_port
from devtools.waiting import wait_for

MASTER_NAME = "bundle"
# Faster than the data role's 3000 ms, for the tests' time: the sentinels call the
# master down after this silence, then elect a leader and promote a replica.
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 5000


class Node:
    """One redis-server or redis-sentinel process, its config file in its own folder."""

    def __init__(self, root: str, name: str, program: str, config: str, password: str) -> None:
        self.port = free_port()
        self.password = password
        self.folder = os.path.join(root, name)
        self.program = program
        os.makedirs(self.folder)
        self.conf = os.path.join(self.folder, f"{name}.conf")
        with open(self.conf, "w") as out:
            out.write(f"port {self.port}\nbind 127.0.0.1\ndir {self.folder}\n")
            out.write(f"logfile {os.path.join(self.folder, 'log')}\ndaemonize no\n{config}")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([self.program, self.conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, f"{self.program} on port {self.port} answering", timeout=30)

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(
            "127.0.0.1", self.port, password=self.password, socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.program} exited with {self.process.returncode}")
        try:
            with self.client() as c:
                return bool(c.ping())
        except redis.ConnectionError:
            return False

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a frozen one, too
            self.process.kill()
            self.process.wait(30)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class SentinelSet:
    def __init__(self, replicas: int = 1, sentinels: int = 3, master_name: str = MASTER_NAME) -> None:
        self.password = secrets.token_hex(12)
        self.master_name = master_name
        self.root = tempfile.mkdtemp(prefix="bundle-sentinel-")
        self.servers = [self._server(f"redis-{i}") for i in range(replicas + 1)]
        first = self.servers[0]
        for replica in self.servers[1:]:
            with open(replica.conf, "a") as out:
                out.write(f"replicaof 127.0.0.1 {first.port}\n")
        self.sentinels = [self._sentinel(f"sentinel-{i}", first.port) for i in range(sentinels)]
        try:
            for node in self.servers + self.sentinels:
                node.start()
            wait_for(self._all_known, "the sentinels knowing each other and every replica", timeout=60)
        except BaseException:
            self.close()
            raise

    def _server(self, name: str) -> Node:
        config = (
            f"requirepass {self.password}\nmasterauth {self.password}\n"
            'appendonly yes\nappendfsync always\nsave ""\ndatabases 64\n'
            # A replica's full sync starts at once (Redis waits 5 s for more replicas).
            "repl-diskless-sync-delay 0\n"
        )
        return Node(self.root, name, "redis-server", config, self.password)

    def _sentinel(self, name: str, master_port: int) -> Node:
        config = (
            f"requirepass {self.password}\n"
            f"sentinel monitor {self.master_name} 127.0.0.1 {master_port} 2\n"
            f"sentinel auth-pass {self.master_name} {self.password}\n"
            f"sentinel sentinel-pass {self.password}\n"
            f"sentinel down-after-milliseconds {self.master_name} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {self.master_name} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {self.master_name} 1\n"
        )
        return Node(self.root, name, "redis-sentinel", config, self.password)

    # ----------------------------------------------------------------- addresses

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://:{self.password}@{hosts}/{self.master_name}/{db}"

    def sentinel_answers(self) -> list[tuple[str, int] | None]:
        """Each running sentinel's get-master-addr-by-name (None when it does not answer)."""
        answers: list[tuple[str, int] | None] = []
        for sentinel in self.sentinels:
            try:
                with sentinel.client() as c:
                    host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
                answers.append((host.decode(), int(port)))
            except (redis.RedisError, TypeError, ValueError):
                answers.append(None)
        return answers

    def master_address(self) -> tuple[str, int]:
        """The master the sentinels agree on (they must)."""
        answers = set(self.sentinel_answers())
        if len(answers) != 1 or None in answers:
            raise RuntimeError(f"the sentinels do not agree on the master: {answers}")
        return answers.pop()  # type: ignore[return-value]

    def master(self) -> Node:
        return self._node_at(self.master_address())

    def _node_at(self, address: tuple[str, int]) -> Node:
        return next(n for n in self.servers if n.port == address[1])

    def replicas(self) -> list[Node]:
        master = self.master()
        return [n for n in self.servers if n is not master and n.running()]

    def _role(self, node: Node) -> str | None:
        try:
            with node.client() as c:
                return str(c.info("replication")["role"])
        except redis.RedisError:
            return None

    def _all_known(self) -> bool:
        try:
            replicas = len(self.servers) - 1
            for sentinel in self.sentinels:
                with sentinel.client() as c:
                    state = c.sentinel_master(self.master_name)
                if int(state["num-other-sentinels"]) != len(self.sentinels) - 1:
                    return False
                if int(state["num-slaves"]) != replicas:
                    return False
            return all(self._in_sync(r) for r in self.servers[1:])
        except redis.RedisError:
            return False

    # ----------------------------------------------------------------- faults

    def ready_for_failover(self, timeout: float = 60) -> tuple[str, int]:
        """Until every sentinel saw a replica in sync, which it would promote (a sentinel
        learns a replica's state every 10 s); the master's address."""

        def ready() -> bool:
            try:
                return any(all(self._seen_in_sync(s, r) for s in self.sentinels) for r in self.replicas())
            except (redis.RedisError, RuntimeError):
                return False

        wait_for(ready, "a replica the sentinels would promote", timeout=timeout)
        return self.master_address()

    def kill_master(self) -> tuple[str, int]:
        """SIGKILL the master; its address (wait_for_failover takes it)."""
        old = self.ready_for_failover()
        self._node_at(old).kill()
        return old

    @contextmanager
    def frozen_master(self) -> Iterator[tuple[str, int]]:
        """The master stopped (SIGSTOP) inside: a host gone without FIN or RST, its
        connections silent. SIGCONT on the way out, when it learns it was replaced."""
        old = self.ready_for_failover()
        node = self._node_at(old)
        node.signal(signal.SIGSTOP)
        try:
            yield old
        finally:
            node.signal(signal.SIGCONT)

    def failover(self) -> tuple[str, int]:
        """An admin's SENTINEL FAILOVER (the master steps down cleanly); its old address."""
        old = self.ready_for_failover()
        wait_for(self._failover_started, "a failover started by SENTINEL FAILOVER", timeout=30)
        return old

    def _failover_started(self) -> bool:
        try:
            with self.sentinels[0].client() as c:
                return bool(c.execute_command("SENTINEL", "FAILOVER", self.master_name))
        except redis.ResponseError as exc:
            if "NOGOODSLAVE" in str(exc) or "INPROG" in str(exc):
                return False  # the sentinels have not seen a replica ready yet
            raise

    @contextmanager
    def writes_lost_in_failover(self) -> Iterator[Node]:
        """Yields the master, cut from its replicas: what is written on it inside is
        acknowledged and reaches no replica (asynchronous replication's window, made
        wide). On the way out the master is killed and its replicas may reconnect: one
        of them is promoted without those writes (wait_for_failover)."""
        master = self._node_at(self.ready_for_failover())
        replicas = self.replicas()
        for replica in replicas:
            with replica.client() as c:
                c.config_set("masterauth", "not-the-password")  # it cannot reconnect
        with master.client() as c:
            c.client_kill_filter(_type="replica")
        wait_for(lambda: all(self._link_down(r) for r in replicas), "the replicas cut from the master", timeout=30)
        try:
            yield master
        finally:
            master.kill()
            for replica in replicas:
                with replica.client() as c:
                    c.config_set("masterauth", self.password)

    def _in_sync(self, replica: Node) -> bool:
        with replica.client() as c:
            info = c.info("replication")
        return info["role"] == "slave" and info.get("master_link_status") == "up"

    def _seen_in_sync(self, sentinel: Node, replica: Node) -> bool:
        # What a sentinel last learned of the replica: it promotes only one it saw in sync.
        with sentinel.client() as c:
            seen = c.sentinel_slaves(self.master_name)
        return any(
            int(r["port"]) == replica.port and r.get("master-link-status") == "ok" and not r["is_sdown"] for r in seen
        )

    def _link_down(self, replica: Node) -> bool:
        with replica.client() as c:
            return c.info("replication").get("master_link_status") == "down"

    def wait_for_failover(self, old: tuple[str, int], timeout: float = 60) -> tuple[str, int]:
        """Until every running sentinel names a new master, which says it is one, and the
        old one, if it answers, says it is a replica (a planned failover leaves it master
        for a while: clients still connected to it write there, and lose it); the new
        master's address."""

        def done() -> tuple[str, int] | None:
            answers = {a for a, s in zip(self.sentinel_answers(), self.sentinels, strict=True) if s.running()}
            if len(answers) != 1:
                return None
            new = answers.pop()
            if new is None or new == old or self._role(self._node_at(new)) != "master":
                return None
            return new if self._role(self._node_at(old)) in (None, "slave") else None

        return wait_for(done, f"a failover of {self.master_name} away from port {old[1]}", timeout=timeout)

    def restart(self, address: tuple[str, int]) -> None:
        """Start the server that was at `address` again (the sentinels make it a replica)."""
        node = self._node_at(address)
        node.kill()
        node.start()

    def wait_for_replica(self, address: tuple[str, int], timeout: float = 60) -> None:
        """Until the server at `address` replicates the current master, in sync."""
        node = self._node_at(address)

        def synced() -> bool:
            try:
                return self._in_sync(node) and all(self._seen_in_sync(s, node) for s in self.sentinels)
            except redis.RedisError:
                return False

        wait_for(synced, f"the server at port {address[1]} replicating the master", timeout=timeout)

    # ----------------------------------------------------------------- the set's life

    def close(self) -> None:
        for node in self.sentinels + self.servers:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "SentinelSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
