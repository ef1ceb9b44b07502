"""`python -m app.backup`: the one way a host's data leaves it and comes back.

    create                        back up this host now, online, into the restic repository
    list [--host NAME]            the snapshots in the repository
    verify [SNAPSHOT]             check the repository and read a snapshot back whole
    restore SNAPSHOT [--replace]  put a snapshot back (an id, or `latest`)
    init                          make the repository when it does not exist yet
    record-provisioned            (the playbook) what a fresh host's provisioning left

Configured by the BACKUP_* variables (app/backup/settings.py, docs/backup.md). Exit
codes: 0 done; 1 with `error: <sentence>` when it failed or refused (and changed
nothing); 2 for a configuration or usage error."""

import sys

from app.backup import commands
from app.backup.errors import BackupError
from app.backup.settings import BackupSettings
from app.common.cli import CommandLine

cli = CommandLine("python -m app.backup", __doc__)


def _guarded(run):
    def handler(args, streams):
        try:
            run(BackupSettings.from_env(), args, streams.out)
        except BackupError as exc:
            streams.err.write(f"error: {exc}\n")
            return 1
        return 0

    return handler


def _host_argument(parser):
    parser.add_argument("--host", help="only this host's")


def _snapshot_argument(parser, default=None):
    parser.add_argument("snapshot", nargs="?" if default else None, default=default, help="a snapshot id, or latest")
    parser.add_argument("--host", help="whose snapshots `latest` means (default BACKUP_HOST_NAME)")


cli.add("create", "back up this host now", _guarded(lambda s, a, out: commands.create(s, out)))
cli.add(
    "list",
    "the snapshots in the repository",
    _guarded(lambda s, a, out: commands.list_snapshots(s, out, a.host)),
    _host_argument,
)
cli.add(
    "verify",
    "check the repository and read a snapshot back whole",
    _guarded(lambda s, a, out: commands.verify(s, out, a.snapshot, a.host)),
    lambda p: _snapshot_argument(p, default="latest"),
)


def _restore_arguments(parser):
    _snapshot_argument(parser)
    parser.add_argument("--replace", action="store_true", help="put this host's data aside and restore over it")


cli.add(
    "restore",
    "put a snapshot back",
    _guarded(lambda s, a, out: commands.restore(s, out, a.snapshot, a.host, a.replace)),
    _restore_arguments,
)
cli.add("init", "make the repository when it does not exist", _guarded(lambda s, a, out: commands.init(s, out)))
cli.add(
    "record-provisioned",
    "keep what a fresh host's provisioning left (the playbook)",
    _guarded(lambda s, a, out: commands.record_provisioned(s, out)),
)

if __name__ == "__main__":
    sys.exit(cli.main())
