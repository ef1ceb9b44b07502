"""Which job worker runs which command, when several workers (on one host or many)
take jobs from one Redis queue.

A command left `running` by a worker that stopped or crashed is failed (retry starts
it again). With one worker (the embedded SQLite queue) every `running` command at its
start is such a command. With several, another worker may be running it right now:
so each worker keeps a key `bundle:notebook:worker:<id>` alive in Redis (a TTL it
refreshes), and records itself among the holders of each command it is about to run
(the hash `bundle:notebook:jobs:holders:<command>`, written before the claim in the
database, so that the claim's winner is always recorded; a loser, which got a second
copy of the job, takes itself out again). A `running` command is orphaned when none
of its holders is alive: a holder is gone when this worker can see that its process
is (same kernel boot and PID namespace: a worker restarted on its host finds its
predecessor's jobs at once), or when its key has expired, a judgement that a worker
makes only once it has itself been connected to Redis for a whole TTL (a live holder
refreshes its key several times within one, even after Redis itself restarted).
Every worker sweeps for orphaned commands at its start and then every BEAT_SECONDS.
A Redis failover may lose a holder's record (replication is asynchronous): each beat
records the worker again among the holders of the commands it runs, a worker never
judges the commands it runs, and a command with no holder recorded is orphaned only
when it still has none at the next sweep (a beat has come in between).
"""

import logging
import os
import secrets
import threading
import time
from contextlib import contextmanager

import redis

from app.common import redis_client

log = logging.getLogger("bundle.notebook.worker")

TTL_SECONDS = 30
BEAT_SECONDS = 10


def _alive_key(worker_id):
    return redis_client.key("notebook", "worker", worker_id)


def _holders_key(command_key):
    return redis_client.key("notebook", "jobs", "holders", command_key)


def _process_space():
    """What makes process ids comparable: this kernel's boot and this PID namespace
    (another host, or another container of this host, has another one). Random when
    it cannot be read: then no other worker's process id is ever judged."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
        return f"{boot}-{namespace}"
    except OSError:
        return secrets.token_hex(8)


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Presence:
    def __init__(self, client):
        self.client = client
        self.space = _process_space()
        self.id = f"{self.space}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stopping = threading.Event()
        self._connected_since = None  # when this run of unbroken beats began (monotonic)
        self._held = set()  # the commands this worker runs now
        self._unrecorded = set()  # running commands with no holder recorded, at the last sweep
        self._held_lock = threading.Lock()  # a beat never re-records a command just released

    # ------------------------------------------------------------------ this worker

    def beat(self):
        """Refresh this worker's key, and record it again among the holders of the
        commands it runs (a Redis failover may have lost the record: another worker's
        sweep would find the command orphaned); False when Redis did not answer."""
        try:
            with self._held_lock:
                with self.client.pipeline(transaction=False) as pipe:
                    pipe.set(_alive_key(self.id), str(int(time.time())), ex=TTL_SECONDS)
                    for command_key in self._held:
                        pipe.hset(_holders_key(command_key), self.id, str(int(time.time())))
                    pipe.execute()
        except redis.RedisError as exc:
            if self._connected_since is not None:
                log.warning("the job queue's Redis does not answer: %s", exc)
            self._connected_since = None
            return False
        if self._connected_since is None:
            self._connected_since = time.monotonic()
        return True

    def start(self, sweep):
        """Beat every BEAT_SECONDS in a thread, and call `sweep()` as often in another
        (a slow database never delays a beat)."""
        self.beat()

        def beating():
            while not self._stopping.wait(BEAT_SECONDS):
                self.beat()

        def sweeping():
            while not self._stopping.wait(BEAT_SECONDS):
                if self._connected_since is None:
                    continue
                try:
                    sweep()
                except Exception:  # a database or Redis failure: the next round tries again
                    log.exception("the sweep for jobs cut off by a stopped worker failed")

        for target, name in ((beating, "worker-presence"), (sweeping, "worker-sweep")):
            threading.Thread(target=target, daemon=True, name=name).start()

    def stop(self):
        """This worker is gone: the others' next sweeps find its `running` commands."""
        self._stopping.set()
        try:
            self.client.delete(_alive_key(self.id))
        except redis.RedisError:
            pass  # it expires

    @contextmanager
    def holding(self, command_key):
        """Around a job: this worker among the holders of `command_key` (before the claim)."""
        holders = _holders_key(command_key)
        with self._held_lock:
            self._held.add(command_key)
        try:
            self.client.hset(holders, self.id, str(int(time.time())))
        except redis.RedisError as exc:
            # Run it anyway: a job left `new` would wait for the next worker start (the
            # next beat records it).
            log.warning("command %s runs without its holder recorded (Redis: %s)", command_key, exc)
        try:
            yield
        finally:
            with self._held_lock:
                self._held.discard(command_key)
                try:
                    self.client.hdel(holders, self.id)
                except redis.RedisError:
                    pass  # a finished command is never judged again

    # ------------------------------------------------------------------ the others

    def orphaned(self, command_keys):
        """Those of `command_keys` (commands `running` in the database) whose workers are
        all gone, as far as can be told now (see the module's docstring). Their holders
        are forgotten: the caller fails them, and they never run again."""
        if not command_keys:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for key in command_keys:
                pipe.hkeys(_holders_key(key))
            holders_of = pipe.execute()
        judge_expired = self._connected_since is not None and time.monotonic() - self._connected_since > TTL_SECONDS
        found, unrecorded = [], set()
        for key, holders in zip(command_keys, holders_of):
            holders = [h.decode() if isinstance(h, bytes) else h for h in holders]
            if key in self._held:
                continue  # this worker runs it (its record may be lost: the next beat makes it again)
            if not holders:
                # No holder recorded: lost in a Redis failover, or never made (Redis failed
                # then); its holder's next beat records it again. Orphaned if still so at
                # the next sweep.
                unrecorded.add(key)
                if key not in self._unrecorded:
                    continue
            if not any(self._may_live(holder, judge_expired) for holder in holders):
                found.append(key)
        self._unrecorded = unrecorded
        if found:
            self.client.delete(*(_holders_key(key) for key in found))
        return found

    def _may_live(self, holder, judge_expired):
        if holder == self.id:
            return True
        if self._dead_here(holder):
            return False
        return not judge_expired or bool(self.client.exists(_alive_key(holder)))

    def _dead_here(self, holder):
        """A holder that was a process of this process space, gone now (this process
        too, when it has this process's id: a predecessor)."""
        space, pid, _ = (holder.rsplit(":", 2) + ["", ""])[:3]
        if space != self.space or not pid.isdigit():
            return False
        return int(pid) == os.getpid() or not _process_exists(int(pid))
