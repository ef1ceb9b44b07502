"""A throwaway PostgreSQL cluster with automatic failover, for tests and benches:
three Patroni members (Debian's `patroni` on the system python3, its Raft store from
python3-pysyncobj: no etcd) on loopback, each with its own data folder and ports,
synchronous replication to one standby, and faults to play a lost host with.

    with PatroniCluster() as cluster:
        url = cluster.new_database()      # postgresql://postgres@127.0.0.1:p1,...:p3/<name>
        old = cluster.leader()            # the member index Patroni made primary
        cluster.freeze_member(old)        # SIGSTOP of its Patroni and its postgres
        new = cluster.wait_for_leader(other_than=old)
        cluster.thaw_member(old)          # it finds itself demoted, rewinds, follows
        cluster.wait_streaming(old)
        cluster.cut_member(new)           # frozen, and its PostgreSQL port's packets dropped (nft)
        cluster.reconnect_member(new)

cut_member needs root and nftables. As root (the tests here) the members run as
devtools.pg_server's dedicated system user: PostgreSQL refuses root. Loopback
trusts every connection (a test cluster holds no secret); fsync is off (a test
cluster never outlives its session) but synchronous commit is on, as in production:
a commit is acknowledged once the synchronous standby has it, which is what a
failover keeps.

Timings (Patroni's DCS settings): ttl 10 s, loop_wait 1 s, retry_timeout 4 s, with which
a failover measured 11.8 s (the defaults take 26 s); the playbook's hosts use 20/2/9.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import psycopg

from devtools.pg_server import _server_user, server_bin_dir
from devtools.services import free_port
from devtools.waiting import wait_for

PATRONI = "/usr/bin/patroni"  # Debian's, on the system python3 (pysyncobj is there)
SCOPE = "bundle-test"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 4
# Bootstrapping (initdb, two base backups) on a loaded 2-core machine.
START_SECONDS = 120
# A failover takes ttl plus a loop or two; a rejoin (pg_rewind, then catching up) ~10 s.
FAILOVER_SECONDS = 60
REJOIN_SECONDS = 90
# A REST call to a member that may be frozen: given up on quickly.
REST_SECONDS = 1.0


class Member:
    """One Patroni member: its ports, folders and process."""

    def __init__(self, root: Path, index: int):
        self.index = index
        self.name = f"member{index}"
        self.folder = root / self.name
        self.data = self.folder / "data"
        self.pg_port = free_port()
        self.rest_port = free_port()
        self.raft_port = free_port()
        self.config = self.folder / "patroni.yml"
        self.log = self.folder / "patroni.log"
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.pg_port}"

    def postgres_pids(self) -> list[int]:
        """The postmaster's pid and its children's (backends, walsender...), postmaster first."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return []
        return [postmaster, *_children(postmaster)] if _alive(postmaster) else []


class PatroniCluster:
    def __init__(self, members: int = 3, max_connections: int = 300):
        self.bin = server_bin_dir()
        self.user = _server_user()
        # Under /tmp whatever TMPDIR says when the members run as another user: a test's
        # own temporary folder (pytest's, 0700) is closed to them.
        self.root = Path(tempfile.mkdtemp(prefix="bundle-patroni-", dir="/tmp" if self.user else None))
        self.max_connections = max_connections
        self.members = [Member(self.root, i) for i in range(members)]
        self._log_handles: list = []
        self._cut: set[int] = set()  # members cut off by nftables tables of their own
        try:
            for member in self.members:
                member.folder.mkdir()
                member.config.write_text(json.dumps(self._config(member), indent=1))  # YAML reads JSON
                if self.user:
                    os.chown(member.folder, *self.user)
            if self.user:
                os.chown(self.root, *self.user)
            for member in self.members:
                self.start_member(member.index, wait=False)
            self.wait_healthy(timeout=START_SECONDS)
        except BaseException:
            self.close()
            raise

    # -- configuration -------------------------------------------------------------

    def _config(self, member: Member) -> dict:
        partners = [f"127.0.0.1:{m.raft_port}" for m in self.members if m is not member]
        return {
            "scope": SCOPE,
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{member.rest_port}",
                "connect_address": f"127.0.0.1:{member.rest_port}",
            },
            "raft": {
                "data_dir": str(member.folder / "raft"),
                "self_addr": f"127.0.0.1:{member.raft_port}",
                "partner_addrs": partners,
            },
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",  # pg_rewind needs it (or checksums)
                            "max_connections": self.max_connections,
                            "fsync": "off",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "no-sync"],
            },
            "postgresql": {
                "listen": member.address,
                "connect_address": member.address,
                "data_dir": str(member.data),
                "bin_dir": self.bin,
                "pgpass": str(member.folder / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(member.folder)},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    # -- what the cluster looks like -------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """libpq's multi-host URL over every member; the service adds target_session_attrs."""
        hosts = ",".join(m.address for m in self.members)
        return f"postgresql://postgres@{hosts}/{database}"

    def member_url(self, index: int, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.members[index].address}/{database}?connect_timeout=3"

    def new_database(self, prefix: str = "test") -> str:
        """A new empty database on the primary; its multi-host URL."""
        import uuid

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url() + "?target_session_attrs=read-write&connect_timeout=3", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def rest(self, index: int, path: str) -> tuple[int, dict]:
        """(status, JSON body) of member `index`'s REST API at `path`; (0, {}) when it
        does not answer within REST_SECONDS (stopped, frozen, starting)."""
        url = f"http://127.0.0.1:{self.members[index].rest_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=REST_SECONDS) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            body = error.read()
            try:
                return error.code, json.loads(body or b"{}")
            except ValueError:
                return error.code, {}
        except (OSError, ValueError):
            return 0, {}

    def leader(self) -> int | None:
        """The member whose Patroni answers `/primary` with 200 (it holds the leader key
        and runs a primary), or None."""
        for member in self.members:
            if self.rest(member.index, "/primary")[0] == 200:
                return member.index
        return None

    def cluster(self, other_than: int | None = None) -> list[dict]:
        """Patroni's `/cluster` members list, as the first answering member sees it."""
        for member in self.members:
            if member.index == other_than:
                continue
            status, body = self.rest(member.index, "/cluster")
            if status == 200 and "members" in body:
                return list(body["members"])
        return []

    def wait_for_leader(self, other_than: int | None = None, timeout: float = FAILOVER_SECONDS) -> int:
        """The leader once one other than `other_than` is primary (a failover done)."""

        def found() -> int | None:
            index = self.leader()
            return None if index is None or index == other_than else index + 1  # 0 is a member

        return wait_for(found, f"a Patroni leader other than member {other_than}", timeout=timeout) - 1

    def streaming(self, index: int) -> bool:
        """Member `index` is a replica that streams from the leader (pg_stat_replication
        there says so) and Patroni's /cluster lists it running."""
        leader = self.leader()
        if leader is None or leader == index:
            return False
        name = self.members[index].name
        listed = [m for m in self.cluster() if m.get("name") == name]
        if not listed or listed[0].get("state") not in ("running", "streaming"):
            return False
        try:
            with psycopg.connect(self.member_url(leader), autocommit=True) as c:
                row = c.execute("SELECT state FROM pg_stat_replication WHERE application_name = %s", (name,)).fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0] == "streaming")

    def wait_streaming(self, index: int, timeout: float = REJOIN_SECONDS) -> None:
        wait_for(lambda: self.streaming(index), f"member {index} streaming from the leader", timeout=timeout)

    def healthy(self) -> bool:
        """Ready for a fault: a leader; every other member a replica on the leader's
        timeline streaming from it; one of them the synchronous standby, as the leader's
        pg_stat_replication, the DCS (/cluster) and the standby itself (/synchronous) all
        say. A failover started before that (just after a rejoin) may find no member
        Patroni would promote."""
        leader = self.leader()
        if leader is None:
            return False
        members = self.cluster()
        timeline = next((m.get("timeline") for m in members if m.get("role") == "leader"), None)
        replicas = [m for m in members if m.get("role") in ("replica", "sync_standby")]
        if len(replicas) != len(self.members) - 1 or any(m.get("timeline") != timeline for m in replicas):
            return False
        synced = [m["name"] for m in members if m.get("role") == "sync_standby"]
        if len(synced) != 1 or self.rest(self._index(synced[0]), "/synchronous")[0] != 200:
            return False
        try:
            with psycopg.connect(self.member_url(leader), autocommit=True) as c:
                rows = dict(c.execute("SELECT application_name, state || ' ' || sync_state FROM pg_stat_replication"))
        except psycopg.Error:
            return False
        return rows.get(synced[0]) == "streaming sync" and all(
            rows.get(m["name"], "").startswith("streaming") for m in replicas
        )

    def wait_healthy(self, timeout: float = REJOIN_SECONDS) -> None:
        wait_for(self.healthy, "a Patroni leader, every replica streaming, one synchronous", timeout=timeout)

    def _index(self, name: str) -> int:
        return next(m.index for m in self.members if m.name == name)

    # -- faults ------------------------------------------------------------------------

    def start_member(self, index: int, wait: bool = True) -> None:
        """Start member `index`'s Patroni (which starts its postgres: as a replica of the
        leader, rewound first if it was a primary that lost the lead)."""
        member = self.members[index]
        log = open(member.log, "ab")  # closed by close()
        self._log_handles.append(log)
        kwargs = {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user else {}
        member.process = subprocess.Popen(
            [PATRONI, str(member.config)],
            cwd=member.folder,
            env={"PATH": "/usr/bin:/bin", "HOME": str(member.folder), "LANG": "C.UTF-8"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kwargs,
        )
        if wait:
            self.wait_streaming(index)

    def stop_member(self, index: int) -> None:
        """A clean stop: Patroni stops its postgres (fast) and gives the lead up."""
        member = self.members[index]
        if member.process and member.process.poll() is None:
            member.process.send_signal(signal.SIGTERM)
            member.process.wait(timeout=60)
        wait_for(lambda: not member.postgres_pids(), f"{member.name}'s postgres stopped", timeout=60)

    def kill_member(self, index: int) -> None:
        """SIGKILL of the member's Patroni and every postgres process of it (a crash)."""
        member = self.members[index]
        pids = member.postgres_pids()
        if member.process and member.process.poll() is None:
            member.process.kill()
            member.process.wait()
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        wait_for(lambda: not member.postgres_pids(), f"{member.name}'s postgres gone", timeout=30)

    def freeze_member(self, index: int) -> None:
        """SIGSTOP of the member's Patroni, then its postmaster, then the postmaster's
        children (it can no longer fork new ones): a host that stopped answering without
        closing anything (its kernel still acknowledges packets on loopback, so clients
        wait on their open connections until it thaws; a new connection's startup goes
        unanswered and libpq moves on after connect_timeout)."""
        member = self.members[index]
        if member.process:
            _signal(member.process.pid, signal.SIGSTOP)
        pids = member.postgres_pids()
        if pids:
            _signal(pids[0], signal.SIGSTOP)
            for pid in _children(pids[0]):
                _signal(pid, signal.SIGSTOP)

    def thaw_member(self, index: int) -> None:
        """SIGCONT to everything freeze_member stopped, Patroni first: it finds its
        lead lost and demotes its postgres before that serves anyone for long."""
        member = self.members[index]
        if member.process:
            _signal(member.process.pid, signal.SIGCONT)
        pids = member.postgres_pids()
        for pid in reversed(pids):
            _signal(pid, signal.SIGCONT)

    def cut_member(self, index: int) -> None:
        """freeze_member, and every TCP packet to or from its PostgreSQL port dropped
        (an nftables table of its own): to its clients a host cut off the network, as far
        as one machine plays it: no FIN, no RST, no acknowledgement either, so a client's
        unacknowledged data trips its tcp_user_timeout and a new connection's SYN its
        connect_timeout, as on a real network (freeze alone leaves the kernel acknowledging)."""
        member = self.members[index]
        self.freeze_member(index)
        port = member.pg_port
        rules = (
            f"table inet {self._cut_table(index)} {{\n"
            "  chain output { type filter hook output priority -10;"
            f" tcp dport {port} drop; tcp sport {port} drop; }}\n"
            "}\n"
        )
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True, capture_output=True, timeout=30)
        self._cut.add(index)

    def reconnect_member(self, index: int) -> None:
        """Undo cut_member: the packets flow again, then the member thaws."""
        if index in self._cut:
            self._cut.discard(index)
            subprocess.run(
                ["nft", "delete", "table", "inet", self._cut_table(index)], capture_output=True, timeout=30, check=False
            )
        self.thaw_member(index)

    def _cut_table(self, index: int) -> str:
        return f"bundle_patroni_cut_{os.getpid()}_{index}"

    def close(self) -> None:
        for member in self.members:
            self.reconnect_member(member.index)
            try:
                self.kill_member(member.index)
            except TimeoutError:
                pass
        for log in self._log_handles:
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self, index: int, lines: int = 40) -> str:
        """The end of member `index`'s Patroni log (for a failing test's message)."""
        try:
            return "\n".join(self.members[index].log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "PatroniCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: no ps on a minimal box)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
