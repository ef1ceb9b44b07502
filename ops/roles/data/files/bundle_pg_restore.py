"""Restores the bundle's PostgreSQL cluster from pgBackRest's repository (the data role).

    bundle-pg-restore [--target-time 'YYYY-MM-DD HH:MM:SS+00'] [--set BACKUP]
                      [--target-timeline N] [--replace] [--check]

Without --target-time: the chosen backup (default the latest) and every WAL segment
archived after it, to the end of the archive. With it: the moment given (commits after
it are left out), then the server is promoted. Steps: refuse (one line, nothing changed)
when a `bundle_*` database holds a table, unless --replace, or when the repository has
no backup; stop the server; `pgbackrest --delta restore`; start it; wait until it accepts
writes (recovery over); start a new full backup (with --backup-unit) or say to take one.
--check stops after the refusal check on the tables (the bundle-backup wrapper asks it
before it restores the files, pgBackRest's repository among them).

How the server is stopped and started: --unit (systemctl, on a host) or --pg-ctl with
--pgdata (a cluster that pg_ctl runs, as the tests do). pgbackrest, psql and pg_ctl run
as --run-as (the cluster's owner) through runuser; pgbackrest finds its configuration
where it always does (/etc/pgbackrest/pgbackrest.conf, or PGBACKREST_CONFIG).
Standard library only: it runs with the host's python3.
"""

import argparse
import json
import re
import subprocess
import sys
import time

PROG = "bundle-pg-restore"
TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([+-]\d{2}(:?\d{2})?|Z| UTC)?$")
HOLDS_DATA = (
    "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
    " AND n.nspname NOT LIKE 'pg\\_toast%'"
)


class Refused(Exception):
    """A one-line reason to stop; nothing was changed when it is raised before the stop."""


class Cluster:
    def __init__(self, args):
        self.args = args
        self.prefix = ["runuser", "-u", args.run_as, "--"] if args.run_as else []

    def run(self, argv, what, timeout=None, input_text=None):
        done = subprocess.run(
            [*self.prefix, *argv], capture_output=True, text=True, cwd="/", timeout=timeout, input=input_text
        )
        if done.returncode != 0:
            detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise Refused(f"{what} failed ({done.returncode}): {detail[-1] if detail else 'no output'}")
        return done.stdout

    def psql(self, sql, database="postgres"):
        argv = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-U", self.args.pg_user]
        argv += ["-h", self.args.socket_dir] if self.args.socket_dir else []
        argv += ["-p", str(self.args.port)] if self.args.port else []
        return self.run([*argv, "-d", database], "psql", timeout=60, input_text=sql).strip()

    def pgbackrest(self, *argv, timeout=None):
        return self.run(["pgbackrest", f"--stanza={self.args.stanza}", *argv], f"pgbackrest {argv[-1]}", timeout)

    def holders(self):
        """The bundle_* databases that hold a table; Refused when the server does not answer."""
        names = self.psql("SELECT datname FROM pg_database WHERE datname LIKE 'bundle\\_%' ORDER BY datname")
        return [name for name in names.split() if int(self.psql(HOLDS_DATA, name) or 0) > 0]

    def backups(self):
        info = json.loads(self.pgbackrest("--output=json", "info", timeout=300) or "[]")
        return [backup["label"] for stanza in info for backup in stanza.get("backup", [])]

    def stop(self):
        if self.args.unit:
            self.run_root(["systemctl", "stop", self.args.unit], "stopping PostgreSQL")
        else:
            self.run(
                [self.args.pg_ctl, "stop", "--pgdata", self.args.pgdata, "--wait", "--mode", "fast"], "pg_ctl stop"
            )

    def start(self):
        if self.args.unit:
            self.run_root(["systemctl", "start", self.args.unit], "starting PostgreSQL")
        else:
            argv = [self.args.pg_ctl, "start", "--pgdata", self.args.pgdata, "--wait", "--timeout", "3600"]
            self.run([*argv, "--log", self.args.log] if self.args.log else argv, "pg_ctl start")

    @staticmethod
    def run_root(argv, what):
        done = subprocess.run(argv, capture_output=True, text=True, cwd="/")
        if done.returncode != 0:
            raise Refused(f"{what} failed: {done.stderr.strip() or done.returncode}")

    def wait_writable(self, timeout):
        """Until the server answers and is out of recovery (promoted): it accepts writes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.psql("SELECT pg_is_in_recovery()") == "f":
                    return
            except Refused:
                pass  # not accepting connections yet
            if time.monotonic() > deadline:
                raise Refused(f"PostgreSQL still recovers (or does not answer) after {timeout:g} s: see its log")
            time.sleep(0.5)  # polling the server's state with a deadline


def restore_argv(args):
    """pgbackrest's restore options for the chosen point."""
    argv = ["--delta"]
    if args.set:
        argv.append(f"--set={args.set}")
    if args.target_time:
        argv += ["--type=time", f"--target={args.target_time}", "--target-action=promote"]
    if args.target_timeline:
        argv.append(f"--target-timeline={args.target_timeline}")
    return [*argv, "restore"]


def parse(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target-time", help="recover to this moment, e.g. '2025-01-31 13:45:00+00'")
    parser.add_argument("--set", help="the backup to start from (a label of `pgbackrest info`; default the latest)")
    parser.add_argument("--target-timeline", help="the timeline to follow (default: the latest)")
    parser.add_argument("--replace", action="store_true", help="restore even when a bundle_* database holds tables")
    parser.add_argument("--check", action="store_true", help="only say whether the restore would be refused")
    parser.add_argument("--stanza", default="bundle")
    parser.add_argument("--run-as", default="postgres", help="the cluster's owner ('' for the current user)")
    parser.add_argument("--pg-user", default="postgres")
    parser.add_argument("--port", type=int)
    parser.add_argument("--socket-dir")
    parser.add_argument("--unit", help="the cluster's systemd unit, e.g. postgresql@15-main.service")
    parser.add_argument("--backup-unit", help="a unit that takes a full backup, started once the server is writable")
    parser.add_argument("--pg-ctl", help="pg_ctl's path (instead of --unit)")
    parser.add_argument("--pgdata", help="the data folder (with --pg-ctl)")
    parser.add_argument("--log", help="the server's log file (with --pg-ctl)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the recovery may take")
    args = parser.parse_args(argv)
    if not args.unit and not (args.pg_ctl and args.pgdata):
        parser.error("give --unit, or --pg-ctl with --pgdata")
    if args.target_time and not TIME.match(args.target_time):
        parser.error(f"--target-time {args.target_time!r} is not 'YYYY-MM-DD HH:MM:SS+00'")
    return args


def main(argv=None):
    args = parse(argv)
    cluster = Cluster(args)
    try:
        if not args.replace:
            try:
                holders = cluster.holders()
            except Refused as exc:
                raise Refused(
                    f"cannot tell whether PostgreSQL holds data ({exc}); give --replace to restore anyway"
                ) from None
            if holders:
                raise Refused(f"{', '.join(holders)} hold tables: give --replace to overwrite them with the backup")
        if args.check:
            return 0  # the repository may come later (bundle-backup restore brings it back)
        backups = cluster.backups()
        if not backups:
            raise Refused(f"pgBackRest's repository has no backup of stanza {args.stanza}")
        cluster.stop()
        cluster.pgbackrest(*restore_argv(args))
        cluster.start()
        cluster.wait_writable(args.timeout)
    except Refused as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    point = f"to {args.target_time}" if args.target_time else "to the end of the archived WAL"
    print(f"{PROG}: restored {args.set or backups[-1]} {point}; PostgreSQL accepts writes")
    if (
        args.backup_unit
        and subprocess.run(["systemctl", "start", "--no-block", args.backup_unit], cwd="/").returncode == 0
    ):
        print(f"{PROG}: a new full backup runs now (journalctl -u {args.backup_unit})")
    else:
        print(f"{PROG}: take a new full backup now: pgbackrest --stanza={args.stanza} --type=full backup")
    return 0


if __name__ == "__main__":
    sys.exit(main())
