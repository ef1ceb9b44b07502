"""The skeleton of a service's host-side commands (`python -m app.<service> <command>`),
written once: argparse with one sub-command each, the streams they write to, the
command every database service has (`copy-to-postgres URL`), and the exit codes:

- what the command returns (0 done, 1 refused or failed, ...);
- 2 with `error: <message>` on standard error for a configuration error (a bad
  DATA_DIR, DATABASE_URL, ... : app.common.config.ConfigError), and for the
  arguments argparse refuses (its own message and usage);
- 130 on Ctrl-C, for the commands that follow a stream until interrupted (asked
  with `interrupted=130`; elsewhere Python's own handling stays).

    commands = CommandLine("python -m app.wizard", __doc__)
    commands.add_copy_to_postgres(lambda: CopyPlan(HISTORY, settings().database_url))
    def main(argv=None): return commands.main(argv)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from app.common.config import ConfigError

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
            return self._handlers[args.command](args, streams)
        except ConfigError as exc:
            streams.err.write(f"error: {exc}\n")
            return 2
        except KeyboardInterrupt:
            if self.interrupted is None:
                raise
            return self.interrupted
