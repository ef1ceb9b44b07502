"""The one registry of the bundle's services: `services.json` at the top of the checkout.

Each entry says what the tools around a service need to know of it:

- `name`: the service, `SERVICE=<name>`, the package `app/<name>`;
- `port`: its loopback port (gunicorn.conf.py's default PORT; the playbook's `bundle_ports`);
- `spec`: the part of the specification it implements;
- `health`: the cheap route the dev runner, the tests and the staging checks wait on;
- `migrations`: the module of its schema history (`HISTORY`, `open_database`), or null
  when it keeps no relational data; a service with one keeps its data in SQLite under
  DATA_DIR by default, PostgreSQL with DATABASE_URL (`database`; the playbook's
  `bundle_database_services`);
- `redis_db`: the Redis database number the playbook gives it with REDIS_URL, or null
  when it uses no Redis (`bundle_redis_databases`);
- `needs_redis_to_scale`: it refuses WEB_CONCURRENCY>1 without REDIS_URL (gunicorn.conf.py,
  the playbook's `services_need_redis_to_scale`);
- `worker`: it has a background job worker, `python -m app.<name> worker` (`bundle_workers`).

The order of the file is the order of every list of services (the dev runner's start,
the playbook's units). gunicorn.conf.py and the playbook read the JSON file themselves
(gunicorn's config must import no app code); Python code reads it here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REGISTRY_FILE = Path(__file__).resolve().parents[1] / "services.json"


@dataclass(frozen=True)
class Service:
    name: str
    port: int
    spec: str
    health: str
    migrations: str | None
    redis_db: int | None
    needs_redis_to_scale: bool
    worker: bool

    @property
    def database(self) -> bool:
        """Whether it keeps relational data: it has a schema history."""
        return self.migrations is not None


def load(path: Path = REGISTRY_FILE) -> tuple[Service, ...]:
    """The services of the registry file at `path`, in its order."""
    return tuple(Service(**entry) for entry in json.loads(path.read_text()))


SERVICES: tuple[Service, ...] = load()
BY_NAME: dict[str, Service] = {service.name: service for service in SERVICES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
PORTS: dict[str, int] = {service.name: service.port for service in SERVICES}


def service(name: str) -> Service:
    """The registry entry of `name` (KeyError for a name that is not a service)."""
    return BY_NAME[name]
