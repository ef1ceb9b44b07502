"""A counter that tells every worker "this changed", read on a hot path for the price
of a memory read: a cache keeps what it computed beside the value it read first, and
throws it away when the value differs. The writer bumps the counter after its change
is committed and before it answers, so once a change has been answered no worker
uses what it computed before it.

Two backends, as every shared mechanism of the bundle:

- embedded (no REDIS_URL): an 8-byte file in the service's data folder, mapped
  shared by every process of the host (the workers, and a command-line tool that
  changes the same database);
- scale-out (REDIS_URL): a Redis key, for the workers of every host.

A value that cannot be read (Redis down) is None, which matches no cached value:
the caller computes again, so an outage costs time, never correctness.
"""
import fcntl
import logging
import mmap
import os
import struct

import redis

from app.common import redis_client

log = logging.getLogger("bundle.generation")
_COUNTER = struct.Struct("<Q")


class FileGeneration:
    def __init__(self, path):
        self.path = path
        self._map = None
        os.register_at_fork(after_in_child=self._forget)  # a child maps the file anew

    def _forget(self):
        self._map = None

    def _mapped(self):
        if self._map is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o660)
            try:
                if os.fstat(fd).st_size < _COUNTER.size:
                    os.ftruncate(fd, _COUNTER.size)
                self._map = mmap.mmap(fd, _COUNTER.size)
            finally:
                os.close(fd)
        return self._map

    def current(self):
        try:
            return _COUNTER.unpack_from(self._mapped())[0]
        except OSError as exc:  # a data folder that cannot be written: unknown, never stale
            log.warning("the generation %s cannot be read: %s", self.path, exc)
            return None

    def bump(self):
        mapped = self._mapped()
        with open(self.path, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two writers at once still count twice
            _COUNTER.pack_into(mapped, 0, _COUNTER.unpack_from(mapped)[0] + 1)


class RedisGeneration:
    def __init__(self, client, key):
        self.client, self.key = client, key

    def current(self):
        try:
            value = self.client.get(self.key)
        except (redis.RedisError, OSError) as exc:
            log.warning("the generation %s cannot be read: %s", self.key, type(exc).__name__)
            return None
        return int(value or 0)

    def bump(self):
        self.client.incr(self.key)


def generation(service, name, data_dir):
    """The counter `name` of `service`: in Redis when REDIS_URL is set, else a file
    in `data_dir`."""
    client = redis_client.client()
    if client is not None:
        return RedisGeneration(client, f"{redis_client.PREFIX}:{service}:generation:{name}")
    os.makedirs(data_dir, exist_ok=True)
    return FileGeneration(os.path.join(data_dir, f"{name}.generation"))
