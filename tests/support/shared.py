"""What every suite uses: services started as production starts them, stopped
within systemd's time-out, and the database backends a service can run on."""

from pathlib import Path

from devtools import services
from devtools.worker_sockets import worker_holding

ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT = 20.0


class ServiceStarter:
    """start(name, data_dir=None, workers=1, env=None) -> RunningService.

    Every service started is stopped by `stop_all` with SIGTERM, and the test fails
    if one takes 20 s or more to exit (systemd's stop time-out)."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.started = []

    def __call__(self, name, data_dir=None, workers=1, env=None, **kwargs):
        data_dir = data_dir or self.tmp_path_factory.mktemp(f"{name}-data")
        service = services.start(name, data_dir, workers=workers, env=env, **kwargs)
        self.started.append(service)
        return service

    def stop_all(self):
        for service in self.started:
            took = service.stop(timeout=STOP_TIMEOUT)
            assert took < STOP_TIMEOUT, f"{service.name} took {took:.1f} s to stop"


class DatabaseBackend:
    """Where a test's services keep their tables: `env()` is the environment that
    points one service at a new, empty database of this backend."""

    def __init__(self, name, postgres=None):
        self.name, self.postgres = name, postgres

    def env(self):
        return {} if self.postgres is None else {"DATABASE_URL": self.postgres.new_database()}

    def __repr__(self):
        return self.name


def serving_pid(service, response):
    """The pid of the worker that holds the server side of the (still open)
    connection of a streamed `response` (requests), as the kernel tells."""
    return worker_holding(service, response.raw.connection.sock.getsockname()[1])
