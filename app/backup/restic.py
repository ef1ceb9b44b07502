"""restic (Debian's `restic`), driven as a program: its repository and password come
from the settings, its cache lives in the work folder, and each of its failures
becomes one sentence (BackupError) an admin can act on."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.backup.errors import BackupError

TAG = "bundle"  # every snapshot of ours carries it: the repository may hold others
# restic's own words -> what the admin reads.
_KNOWN = (
    (re.compile(r"wrong password or no key found", re.I), "the repository's password is wrong (BACKUP_PASSWORD_FILE)"),
    (re.compile(r"no space left on device", re.I), "the repository's disk is full: nothing was stored"),
    (
        re.compile(r"(repository does not exist|unable to open config file|Is there a repository)", re.I),
        "there is no restic repository at BACKUP_REPOSITORY (make one with `restic init`)",
    ),
    (
        re.compile(r"no matching ID found|no snapshot ID specified|invalid snapshot ID|no snapshot found", re.I),
        "no such snapshot",
    ),
    (
        re.compile(r"repository is already locked exclusively", re.I),
        "the repository is locked by another restic run (a prune or check): try again later",
    ),
)


@dataclass(frozen=True)
class Snapshot:
    id: str
    short_id: str
    time: str
    host: str
    paths: list[str]
    tags: list[str]

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Snapshot:
        return cls(
            id=raw["id"],
            short_id=raw.get("short_id", raw["id"][:8]),
            time=raw["time"],
            host=raw.get("hostname", ""),
            paths=list(raw.get("paths") or []),
            tags=list(raw.get("tags") or []),
        )


class Restic:
    def __init__(self, program: str, repository: str, password_file: str, cache_dir: str) -> None:
        self.program, self.repository = program, repository
        self.password_file, self.cache_dir = password_file, cache_dir

    def _environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith("RESTIC_")}
        return {
            **keep,
            "RESTIC_REPOSITORY": self.repository,
            "RESTIC_PASSWORD_FILE": self.password_file,
            "RESTIC_CACHE_DIR": self.cache_dir,
        }

    def run(self, arguments: Sequence[str], what: str) -> str:
        """restic's standard output; BackupError naming `what` failed and why."""
        return self.run_whole(arguments, what).stdout

    def run_whole(self, arguments: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
        """restic's run (its output and its warnings); BackupError when it failed."""
        if not os.path.isfile(self.password_file):
            raise BackupError(f"no password file at {self.password_file} (BACKUP_PASSWORD_FILE)")
        try:
            done = subprocess.run(
                [self.program, *self._options(arguments[0]), *arguments],
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            raise BackupError(f"{self.program} is not installed (apt-get install restic)") from None
        if done.returncode != 0:
            raise BackupError(f"{what} failed: {explain(done.stderr)}")
        return done

    @staticmethod
    def _options(command: str) -> list[str]:
        """restic's cache (the index, the trees, the snapshots) speeds up `backup` and
        `forget`; everything else reads the repository itself, as a new host would."""
        options = ["--quiet"] if command in ("backup", "forget") else ["--quiet", "--no-cache"]
        return [*options, "--no-lock"] if command == "snapshots" else options

    def initialized(self) -> bool:
        try:
            self.run(["cat", "config"], "reading the repository")
        except BackupError as exc:
            if "there is no restic repository" in str(exc):
                return False
            raise
        return True

    def init(self) -> None:
        self.run(["init"], "making the repository")

    def backup(self, folder: str, host: str, tags: Sequence[str]) -> dict[str, Any]:
        """Store `folder` as a new snapshot; restic's summary (snapshot_id, sizes)."""
        arguments = ["backup", "--json", "--host", host, "--tag", TAG]
        for tag in tags:
            arguments += ["--tag", tag]
        out = self.run([*arguments, folder], "storing the snapshot")
        for line in reversed(out.splitlines()):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("message_type") == "summary":
                return dict(message)
        raise BackupError("storing the snapshot failed: restic printed no summary")

    def snapshots(self, host: str | None = None) -> tuple[list[Snapshot], list[str]]:
        """The snapshots of ours (of `host`), oldest first, and the ids of those restic
        cannot read (a damaged or truncated file: never skipped in silence)."""
        arguments = ["snapshots", "--json", "--tag", TAG]
        if host:
            arguments += ["--host", host]
        done = self.run_whole(arguments, "listing the snapshots")
        damaged = re.findall(r"could not load snapshot (\w+)", done.stderr)
        found = json.loads(done.stdout or "[]")
        return sorted((Snapshot.of(raw) for raw in found), key=lambda s: s.time), damaged

    def find(self, chosen: str, host: str | None) -> Snapshot:
        """The snapshot an admin named: an id (or its start), or `latest` of `host`."""
        if chosen != "latest" and not re.fullmatch(r"[0-9a-f]{4,64}", chosen):
            raise BackupError(f"{chosen!r} is not a snapshot id (see `list`) nor `latest`")
        found, damaged = self.snapshots(host if chosen == "latest" else None)
        if any(d.startswith(chosen) or chosen.startswith(d) for d in damaged) or (chosen == "latest" and damaged):
            raise BackupError(
                f"snapshot {', '.join(damaged)} in the repository is damaged (restic cannot read it): "
                "`restic check` says more; restore another snapshot by its id"
            )
        if chosen == "latest":
            if not found:
                raise BackupError(f"the repository holds no snapshot of host {host!r} (--host names another)")
            return found[-1]
        matches = [s for s in found if s.id.startswith(chosen)]
        if len(matches) != 1:
            raise BackupError(f"no such snapshot: {chosen}" if not matches else f"{chosen} names several snapshots")
        return matches[0]

    def restore(self, snapshot: Snapshot, target: str) -> None:
        self.run(["restore", snapshot.id, "--target", target], f"restoring snapshot {snapshot.short_id}")

    def check(self) -> None:
        self.run(["check"], "checking the repository")

    def forget(self, host: str, last: int, daily: int, weekly: int, monthly: int) -> None:
        self.run(
            [
                "forget", "--prune", "--host", host, "--tag", TAG, "--keep-last", str(last),
                "--keep-daily", str(daily), "--keep-weekly", str(weekly), "--keep-monthly", str(monthly),
            ],
            "the snapshot is stored, but pruning the old ones",
        )  # fmt: skip


def explain(stderr: str) -> str:
    """restic's error output as one sentence."""
    for pattern, sentence in _KNOWN:
        if pattern.search(stderr):
            return sentence
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.lower().startswith("fatal")]
    last = (fatal or lines or ["restic failed without a word"])[-1]
    return re.sub(r"^Fatal:\s*", "", last)
