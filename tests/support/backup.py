"""The backup command (`python -m app.backup`) run as an admin runs it: a process with
its BACKUP_* variables, against a real restic repository in a folder."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import requests

from app.audio.seed import seed
from devtools import services
from devtools.fake_providers import FakeProviders
from tests.support.decks import copy_sample_deck
from tests.support.notebook import Worker
from tests.support.shared import ROOT
from tests.support.wizard import TEST_IDENTITY


@dataclass
class BackupHost:
    """One host's backup settings: its data root, work folder, secrets file, and the
    repository (shared by the hosts of a test, as an off-host repository is)."""

    data_root: Path
    repository: Path
    password_file: Path
    secrets_file: Path | None = None
    work_dir: Path | None = None
    status_file: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("BACKUP_", "RESTIC_"))}
        return {
            **keep,
            "BACKUP_REPOSITORY": str(self.repository),
            "BACKUP_PASSWORD_FILE": str(self.password_file),
            "BACKUP_DATA_ROOT": str(self.data_root),
            "BACKUP_SECRETS_FILE": str(self.secrets_file or ""),
            "BACKUP_WORK_DIR": str(self.work_dir or self.data_root.parent / f"{self.data_root.name}-backup-work"),
            "BACKUP_STATUS_FILE": str(self.status_file or ""),
            "BACKUP_HOST_NAME": "bundle-test",
            **self.extra,
        }

    def run(self, *arguments: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app.backup", *arguments],
            cwd=ROOT,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *arguments: str) -> str:
        done = self.run(*arguments)
        assert done.returncode == 0, f"backup {' '.join(arguments)} exited {done.returncode}: {done.stderr}"
        return done.stdout

    def refused(self, *arguments: str) -> str:
        """The one line of a command that failed or refused (exit 1)."""
        done = self.run(*arguments)
        assert done.returncode == 1, (
            f"backup {' '.join(arguments)} exited {done.returncode}: {done.stdout}{done.stderr}"
        )
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        return lines[0]


_TEMPLATE: list[Path] = []  # one repository made per test process, copied for each test (init costs seconds)


def new_repository(folder: Path) -> tuple[Path, Path]:
    """(repository, password file): a new restic repository in `folder` (a copy of one
    made with `init` once per process: restic's key derivation is slow on purpose)."""
    folder.mkdir(parents=True, exist_ok=True)
    password = folder / "password"
    password.write_text("correct horse battery staple\n")
    password.chmod(0o600)
    repository = folder / "repository"
    if not _TEMPLATE or not _TEMPLATE[0].exists():
        template = Path(tempfile.mkdtemp(prefix="restic-template-")) / "repository"
        atexit.register(shutil.rmtree, template.parent, True)
        BackupHost(folder / "nothing", template, password).ok("init")
        _TEMPLATE[:] = [template]
    shutil.copytree(_TEMPLATE[0], repository)
    return repository, password


class FiveServices:
    """The five services of one host on `data_root` (<root>/<service>), with the
    secrets a provisioned host's secrets file gives them: what a restore drill backs up,
    destroys and brings back. `ports` keeps a replaced host's addresses."""

    def __init__(self, data_root: Path, secrets_file: Path, ai: FakeProviders, ports: dict[str, int] | None = None):
        self.data_root, self.secrets_file, self.ai = data_root, secrets_file, ai
        self.ports = dict(ports or {})
        self.running: dict[str, services.RunningService] = {}
        self.worker: Worker | None = None

    def secrets(self) -> dict[str, str]:
        return json.loads(self.secrets_file.read_text())

    def environment(self, name: str) -> dict[str, str]:
        secrets = self.secrets()
        return {
            "notebook": {
                "NOTEBOOK_PASSWORD": secrets["notebook_password"],
                "NOTEBOOK_ENCRYPTION_KEY": secrets["notebook_encryption_key"],
            },
            "wizard": {"WIZ_AI_BASE_URL": self.ai.base_url(), "WIZ_TEXT_MODEL": "fake-valid-json", **TEST_IDENTITY},
        }.get(name, {})

    def start(self) -> None:
        for name in ("workspace", "decks", "notebook", "audio", "wizard"):
            data_dir = self.data_root / name
            data_dir.mkdir(parents=True, exist_ok=True)
            service = services.start(name, data_dir, port=self.ports.get(name), env=self.environment(name))
            self.running[name] = service
            self.ports[name] = service.port
        # The notebook's job worker, its log beside the data root (not in a data folder).
        self.worker = Worker(
            self.data_root.parent, {"DATA_DIR": str(self.data_root / "notebook"), **self.environment("notebook")}
        )

    def base_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def provision(self) -> None:
        """What the playbook does on a fresh host: the sample deck, the sound library, the Owner."""
        body = copy_sample_deck(self.data_root / "decks")
        requests.post(self.base_url("decks") + "/api/decks/import", json=body, timeout=30).raise_for_status()
        secrets = self.secrets()
        owner = {"username": "admin", "email": "admin@backup.test", "password": secrets["workspace_owner_password"]}
        made = requests.post(self.base_url("workspace") + "/api/v2/users/first", json=owner, timeout=30)
        assert made.status_code == 201, made.text

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        for service in self.running.values():
            service.stop()
        self.running.clear()


def fresh_secrets(path: Path) -> None:
    """A provisioned host's secrets file (the base role makes it), for the services of FiveServices."""
    from cryptography.fernet import Fernet

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "notebook_password": "notebook-" + os.urandom(8).hex(),
                "notebook_encryption_key": Fernet.generate_key().decode(),
                "workspace_owner_password": "owner-" + os.urandom(12).hex(),
            }
        )
    )
    path.chmod(0o600)


def seed_sound_library(data_root: Path) -> None:
    seed(str(data_root / "audio" / "soundlib"))
