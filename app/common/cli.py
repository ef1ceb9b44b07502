"""The skeleton of a service's host-side commands (`python -m app.<service> <command>`),
written once: argparse with one sub-command each, the streams they write to, the
commands every database service has (`copy-to-postgres URL`, `contract [--dry-run]`),
and the exit codes:

- what the command returns (0 done, 1 refused or failed, ...);
- 2 with `error: <message>` on standard error for a configuration error (a bad
  DATA_DIR, DATABASE_URL, ... : app.common.config.ConfigError), and for the
  arguments argparse refuses (its own message and usage);
- 130 on Ctrl-C, for the commands that follow a stream until interrupted (asked
  with `interrupted=130`; elsewhere Python's own handling stays).

    commands = CommandLine("python -m app.wizard", __doc__)
    commands.add_copy_to_postgres(lambda: CopyPlan(HISTORY, settings().database_url))
    commands.add_contract(lambda: (HISTORY, settings().database_url))
    def main(argv=None): return commands.main(argv)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from app.common.config import ConfigError
from app.common.logsetup import configure_logging

if TYPE_CHECKING:  # (peewee and the migrations: imported only by the command that copies)
    from peewee import Model

    from app.common.migrations import History


@dataclass(frozen=True)
class Streams:
    """Where a command reads and writes (the process's own unless a caller gives others)."""

    stdin: TextIO
    out: TextIO
    err: TextIO


Handler = Callable[[argparse.Namespace, Streams], int]
Arguments = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class CopyPlan:
    """What `copy-to-postgres` copies: the migration history of a service's models, its
    SQLite database's URL, the tables it leaves out (`derived`: an index that differs by
    engine), and `rebuild(target_url)`, which makes them on the target and returns the
    line to print."""

    history: History
    source_url: str
    derived: tuple[type[Model], ...] = ()
    rebuild: Callable[[str], str] | None = None


POSTGRES_URL_HELP = "postgresql://user:password@host:port/database"
COPY_HELP = "copy this SQLite database into an empty PostgreSQL one"
CONTRACT_HELP = "run the pending contract schema steps, once no process of an older release is live"


class CommandLine:
    """One service's commands: `add` each (name, help, its arguments, its handler), then
    `main(argv)` parses, runs the chosen one and returns its exit code."""

    def __init__(self, prog: str, doc: str | None, *, interrupted: int | None = None) -> None:
        description = (doc or "").split("\n\n")[0] or None
        self.parser = argparse.ArgumentParser(prog=prog, description=description)
        self._commands = self.parser.add_subparsers(dest="command", required=True)
        self._handlers: dict[str, Handler] = {}
        self.interrupted = interrupted

    def add(
        self, name: str, help: str, handler: Handler, arguments: Arguments | None = None
    ) -> argparse.ArgumentParser:
        """Registers a sub-command; `arguments(parser)` declares its arguments."""
        parser = self._commands.add_parser(name, help=help)
        if arguments is not None:
            arguments(parser)
        self._handlers[name] = handler
        return parser

    def add_copy_to_postgres(self, plan: Callable[[], CopyPlan]) -> None:
        """`copy-to-postgres URL`: app.common.copy_to_postgres.run on the plan, which is
        made only when the command runs (it reads the service's settings)."""

        def copy(args: argparse.Namespace, streams: Streams) -> int:
            from app.common import copy_to_postgres  # (peewee and the drivers: only for this command)

            chosen = plan()
            rebuild = chosen.rebuild
            code: int = copy_to_postgres.run(
                chosen.history,
                chosen.source_url,
                args.url,
                streams.out,
                streams.err,
                derived=chosen.derived,
                rebuild=None if rebuild is None else lambda: rebuild(args.url),
            )
            return code

        def arguments(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("url", help=POSTGRES_URL_HELP)

        self.add("copy-to-postgres", COPY_HELP, copy, arguments)

    def add_contract(self, target: Callable[[], tuple[History, str]]) -> None:
        """`contract [--dry-run]`: the pending contract steps of the schema history on
        the database, (history, DATABASE_URL) from `target()`, made when the command
        runs (app.common.migrations.contract). Exit 0 when done or nothing is pending;
        1 with one line on standard error while a process of another release is live,
        or when the database is not the service's (no SQLite file, a PostgreSQL database
        without its tables: a wrong DATA_DIR or DATABASE_URL), which it does not create."""

        def run(args: argparse.Namespace, streams: Streams) -> int:
            from app.common import live_processes, migrations
            from app.common.db import open_for_command

            history, url = target()
            if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///") :]):
                streams.err.write(
                    f"error: no {history.service} database at {url[len('sqlite:///') :]}: check DATA_DIR\n"
                )
                return 1
            db = open_for_command(url, history)
            try:
                if not migrations.has_history(db, history):
                    streams.err.write(
                        f"error: the database of DATABASE_URL holds no {history.service} schema: check DATABASE_URL\n"
                    )
                    return 1
                done = migrations.contract(db, history, live_processes.RELEASE, dry_run=args.dry_run)
            except (migrations.ContractRefused, migrations.MigrationLockTimeout) as exc:
                streams.err.write(f"error: {exc}\n")
                return 1
            finally:
                db.close()
            verb = "would run" if args.dry_run else "ran"
            for step in done.expand:
                streams.out.write(f"{verb} expand step {step.version}: {step.name}\n")
            for step in done.contract:
                streams.out.write(f"{verb} contract step {step.version}: {step.name}\n")
            if not done.contract:
                streams.out.write("nothing to contract\n")
            for blocker in done.blockers:
                streams.out.write(f"it would refuse now: {blocker} is live\n")
            return 0

        def arguments(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--dry-run", action="store_true", help="list the steps that would run, change nothing")

        self.add("contract", CONTRACT_HELP, run, arguments)

    def main(
        self,
        argv: Sequence[str] | None = None,
        stdin: TextIO | None = None,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> int:
        """Parses `argv` (the process's arguments by default), runs the command, returns
        its exit code."""
        args = self.parser.parse_args(argv)
        streams = Streams(stdin or sys.stdin, out or sys.stdout, err or sys.stderr)
        try:
            configure_logging()  # a command's records too, in the form LOG_FORMAT names
            return self._handlers[args.command](args, streams)
        except ConfigError as exc:
            streams.err.write(f"error: {exc}\n")
            return 2
        except KeyboardInterrupt:
            if self.interrupted is None:
                raise
            return self.interrupted
