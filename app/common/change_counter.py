"""A counter that tells every worker "this changed", read on a hot path for the price
of a memory read: a cache keeps what it computed beside the value it read first, and
throws it away when the value differs. The writer bumps the counter after its change
is committed and before it answers, so once a change has been answered no worker
uses what it computed before it.

One interface (`ChangeCounter`), two backends, as every shared mechanism of the bundle:

- `FileChangeCounter`, embedded (no REDIS_URL): an 8-byte file in the service's data
  folder, mapped shared by every process of the host (the workers, and a
  command-line tool that changes the same database);
- `RedisChangeCounter`, scale-out (REDIS_URL): a Redis key, for the workers of every host.

`change_counter(service, name, data_dir)` gives the one that REDIS_URL asks for.

A value that cannot be read (Redis down) is None, which matches no cached value:
the caller computes again, so an outage costs time, never correctness.
"""

import fcntl
import logging
import mmap
import os
import struct
from typing import Protocol

import redis

from app.common import redis_client

log = logging.getLogger("bundle.generation")
_COUNTER = struct.Struct("<Q")


class ChangeCounter(Protocol):
    def current(self) -> int | None:
        """The counter's value; None when it cannot be read (matches nothing cached)."""
        ...

    def bump(self) -> None:
        """Count one change (after it is committed, before it is answered)."""
        ...


class FileChangeCounter:
    """The counter in an 8-byte file mapped by every process of the host."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: mmap.mmap | None = None
        os.register_at_fork(after_in_child=self._forget)  # a child maps the file anew

    def _forget(self) -> None:
        self._map = None

    def _mapped(self) -> mmap.mmap:
        if self._map is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o660)
            try:
                if os.fstat(fd).st_size < _COUNTER.size:
                    os.ftruncate(fd, _COUNTER.size)
                self._map = mmap.mmap(fd, _COUNTER.size)
            finally:
                os.close(fd)
        return self._map

    def current(self) -> int | None:
        try:
            value: int = _COUNTER.unpack_from(self._mapped())[0]
        except OSError as exc:  # a data folder that cannot be written: unknown, never stale
            log.warning("the generation %s cannot be read: %s", self.path, exc)
            return None
        return value

    def bump(self) -> None:
        mapped = self._mapped()
        with open(self.path, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two writers at once still count twice
            _COUNTER.pack_into(mapped, 0, _COUNTER.unpack_from(mapped)[0] + 1)


# Bumps fit below this bit for ages (2**48); the masters seen count above it.
MASTER_EPOCH_SHIFT = 48


class RedisChangeCounter:
    """The counter in a Redis key, shared by the workers of every host.

    With Sentinel, a failover may lose the last bumps (replication is asynchronous): the
    counter goes back to a value that a worker's cache still holds, computed before the
    change. So the value read carries, in its high bits, how many masters this process
    has seen: after a failover it differs from anything read before, and every cache of
    this process computes again."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key
        self._master: object = None  # the master's address when last read (Sentinel)
        self._masters_seen = 0

    def current(self) -> int | None:
        try:
            value = self.client.get(self.key)
        except (redis.RedisError, OSError) as exc:
            log.warning("the generation %s cannot be read: %s", self.key, type(exc).__name__)
            return None
        return int(value or 0) + (self._master_epoch() << MASTER_EPOCH_SHIFT)

    def _master_epoch(self) -> int:
        # The pool learns the master's address at each new connection (a memory read here).
        master = getattr(self.client.connection_pool, "master_address", None)
        if master != self._master:
            self._master, self._masters_seen = master, self._masters_seen + 1
        return self._masters_seen

    def bump(self) -> None:
        self.client.incr(self.key)


def change_counter(service: str, name: str, data_dir: str) -> ChangeCounter:
    """The counter `name` of `service`: in Redis when REDIS_URL is set, else a file
    in `data_dir`. (The key and the file keep their first names, `...:generation:<name>`
    and `<name>.generation`: a renamed one would start again from 0 beside the old.)"""
    client = redis_client.client()
    if client is not None:
        return RedisChangeCounter(client, f"{redis_client.PREFIX}:{service}:generation:{name}")
    os.makedirs(data_dir, exist_ok=True)
    return FileChangeCounter(os.path.join(data_dir, f"{name}.generation"))
