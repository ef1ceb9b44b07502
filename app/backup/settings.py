"""The backup command's configuration, read once from the environment.

Each variable is declared once below (name, default, meaning); the reference table
in docs/backup.md is written from these declarations (devtools.reference). On a
host the `backup` role writes them into /etc/bundle/backup.conf, which
`bundle-backup` (and the timer's unit) hand to `python -m app.backup`.

Standard library only: a data host without the services' venv runs the command
with the system Python from the playbook's checkout."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from app import registry
from app.common import config
from app.common.config import ConfigError, Integer, Text

VARIABLES = config.Variables("the backup command")
REPOSITORY = VARIABLES.add(
    Text(
        name="BACKUP_REPOSITORY",
        values="restic repository",
        doc="Where snapshots go: a restic repository (a folder, `sftp:user@host:/path`, `rest:https://...`). "
        "Keep it off this host.",
    )
)
PASSWORD_FILE = VARIABLES.add(
    Text(
        name="BACKUP_PASSWORD_FILE",
        values="path",
        doc="A file holding the repository's password (restic encrypts every snapshot with it). "
        "Keep a copy off the host: a fresh host needs it to restore.",
    )
)
DATA_ROOT = VARIABLES.add(
    Text(
        name="BACKUP_DATA_ROOT",
        shown_default="`./var`",
        values="path",
        doc="The folder that holds each service's DATA_DIR as `<root>/<service>` (hosts: /var/lib/bundle).",
    )
)
SERVICES = VARIABLES.add(
    Text(
        name="BACKUP_SERVICES",
        shown_default="every service with a folder under the data root",
        values="service names, space-separated",
        doc="The services whose data folders a snapshot holds.",
    )
)
SECRETS_FILE = VARIABLES.add(
    Text(
        name="BACKUP_SECRETS_FILE",
        values="path",
        doc="The host's secrets file (/etc/bundle/secrets.json), kept in each snapshot (encrypted by the "
        "repository) and put back by a restore. Blank: none.",
    )
)
EXTRA_PATHS = VARIABLES.add(
    Text(
        name="BACKUP_EXTRA_PATHS",
        values="absolute folders, `:`-separated",
        doc="More folders kept as plain files and put back by a restore (a data host: the pgBackRest "
        "repository, so that it leaves the host with each snapshot).",
    )
)
WORK_DIR = VARIABLES.add(
    Text(
        name="BACKUP_WORK_DIR",
        shown_default="`<data root>/.backup`",
        values="path",
        doc="Scratch space on the data root's file system: the copy a snapshot is taken from, a restore's "
        "scratch folder, and the data a restore replaced (kept, never deleted).",
    )
)
CACHE_DIR = VARIABLES.add(
    Text(
        name="BACKUP_CACHE_DIR",
        shown_default="`<work folder>/cache`",
        values="path",
        doc="restic's cache of the repository's index (a cache: losing it costs time only).",
    )
)
STATUS_FILE = VARIABLES.add(
    Text(
        name="BACKUP_STATUS_FILE",
        values="path",
        doc="A Prometheus textfile (the node exporter's collector) the command rewrites after each "
        "`create`: the time of the last success and of the last run, its outcome, duration and size. "
        "Blank: none.",
    )
)
HOST_NAME = VARIABLES.add(
    Text(
        name="BACKUP_HOST_NAME",
        shown_default="the machine's host name",
        values="name",
        doc="The host a snapshot is filed under (restic's --host); `restore latest` takes this host's latest. "
        "Give a replacement host the name of the one it replaces.",
    )
)
KEEP_LAST = VARIABLES.add(
    Integer(
        name="BACKUP_KEEP_LAST",
        default=3,
        minimum=1,
        doc="Snapshots kept after each `create`: the newest this many, whatever their day (a snapshot taken "
        "by hand before an upgrade survives the night's)...",
    )
)
KEEP_DAILY = VARIABLES.add(
    Integer(
        name="BACKUP_KEEP_DAILY",
        default=7,
        minimum=0,
        doc="... and the last of each of this many days.",
    )
)
KEEP_WEEKLY = VARIABLES.add(Integer(name="BACKUP_KEEP_WEEKLY", default=4, minimum=0, doc="... and of this many weeks."))
KEEP_MONTHLY = VARIABLES.add(
    Integer(name="BACKUP_KEEP_MONTHLY", default=6, minimum=0, doc="... and of this many months.")
)
RESTIC = VARIABLES.add(
    Text(name="BACKUP_RESTIC", default="restic", values="program", doc="The restic program (Debian's `restic`).")
)


@dataclass(frozen=True)
class BackupSettings:
    repository: str
    password_file: str
    data_root: str
    services: tuple[str, ...]
    secrets_file: str
    extra_paths: tuple[str, ...]
    work_dir: str
    cache_dir: str
    status_file: str
    host_name: str
    keep_last: int
    keep_daily: int
    keep_weekly: int
    keep_monthly: int
    restic: str

    def data_dir(self, service: str) -> str:
        return os.path.join(self.data_root, service)

    @classmethod
    def from_env(cls) -> BackupSettings:
        data_root = os.path.abspath(DATA_ROOT.read(str(config.PROJECT_ROOT / "var")))
        work_dir = os.path.abspath(WORK_DIR.read(os.path.join(data_root, ".backup")))
        extra = tuple(p for p in EXTRA_PATHS.read().split(":") if p)
        for path in extra:
            if not os.path.isabs(path):
                raise ConfigError(f"BACKUP_EXTRA_PATHS: {path!r} is not an absolute path")
        return cls(
            repository=REPOSITORY.read(),
            password_file=PASSWORD_FILE.read(),
            data_root=data_root,
            services=_services(SERVICES.read(), data_root),
            secrets_file=SECRETS_FILE.read(),
            extra_paths=tuple(os.path.normpath(p) for p in extra),
            work_dir=work_dir,
            cache_dir=os.path.abspath(CACHE_DIR.read(os.path.join(work_dir, "cache"))),
            status_file=STATUS_FILE.read(),
            host_name=HOST_NAME.read(socket.gethostname()),
            keep_last=KEEP_LAST.read(),
            keep_daily=KEEP_DAILY.read(),
            keep_weekly=KEEP_WEEKLY.read(),
            keep_monthly=KEEP_MONTHLY.read(),
            restic=RESTIC.read(),
        )

    def require_repository(self) -> None:
        """Every command but `record-provisioned` needs the repository and its password."""
        if not self.repository:
            raise ConfigError("BACKUP_REPOSITORY is not set: name the restic repository to use")
        if not self.password_file:
            raise ConfigError("BACKUP_PASSWORD_FILE is not set: name the file that holds the repository's password")


def _services(raw: str, data_root: str) -> tuple[str, ...]:
    if not raw:
        return tuple(name for name in registry.NAMES if os.path.isdir(os.path.join(data_root, name)))
    names = tuple(raw.split())
    for name in names:
        if name not in registry.NAMES:
            raise ConfigError(
                f"BACKUP_SERVICES: unknown service {name!r}: expected some of {', '.join(registry.NAMES)}"
            )
    return names
