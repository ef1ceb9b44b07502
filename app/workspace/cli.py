"""Host-side commands of the workspace platform. They work on the service's
database directly (the same DATA_DIR / DATABASE_URL as the service) and need no
running server.

    python -m app.workspace reset-password <username>
    python -m app.workspace create-admin --username NAME --email EMAIL [--name NAME]
    python -m app.workspace create-owner --username NAME --email EMAIL [--name NAME]
    python -m app.workspace copy-to-postgres postgresql://USER:PASSWORD@HOST/DB
    python -m app.workspace contract [--dry-run]

The password is read from a terminal prompt (asked twice), or from the first line
of standard input when it is not a terminal; it is never an argument.

create-owner claims a new platform as the provisioning does (as POST
/api/v2/users/first would, but from the host, so that no visitor can claim it
first): it creates the initial Owner, or, when the platform has its Owner already,
says so and succeeds without reading a password (the playbook runs it every time).
"""

import getpass
import sys

from flask import Flask

from app.common import config
from app.common.body import validated
from app.common.cli import CommandLine, CopyPlan
from app.common.failures import Failure
from app.workspace.access import accounts, sessions
from app.workspace.access.passwords import weakness
from app.workspace.core.migrations import HISTORY, open_database
from app.workspace.core.models import User, database
from app.workspace.core.payloads import FirstUserSchema
from app.workspace.settings import WorkspaceSettings


def _read_password(stdin, err):
    if stdin.isatty():
        first = getpass.getpass("New password: ")
        if first != getpass.getpass("Repeat it: "):
            raise SystemExit("error: the two passwords differ")
        return first
    line = stdin.readline()
    if not line:
        raise SystemExit("error: no password on standard input")
    return line.rstrip("\r\n")


def _context():
    """A minimal app context: the settings and the database of the service."""
    app = Flask("app.workspace.cli")
    settings = WorkspaceSettings.from_env(config.data_dir("workspace"))
    app.config["WORKSPACE"] = settings
    open_database(settings.database_url)
    return app.app_context()


def reset_password(username, stdin, out, err):
    with _context(), database.connection_context():
        user = User.get_or_none(User.username_key == username.lower())
        if user is None:
            err.write(f"error: no user {username!r}\n")
            return 1
        password = _read_password(stdin, err)
        problem = weakness(password, user.username, user.email)
        if problem:
            err.write(f"error: the password {problem}\n")
            return 1
        accounts.set_password(user, password, actor="host:reset-password")
        sessions.revoke_all(user)
    out.write(f"The password of {user.username} was reset and their sessions were revoked.\n")
    return 0


def create_admin(username, email, name, stdin, out, err):
    with _context(), database.connection_context():
        password = _read_password(stdin, err)
        try:
            if accounts.first_user_exists():
                user = accounts.create(username, email, name, password, roles=["owner"], actor="host:create-admin")
            else:
                user = accounts.create_first(username, email, name, password)
        except Failure as exc:
            err.write(f"error: {_described(exc)}\n")
            return 1
    out.write(f"Created the administrator {user.username} ({user.id}).\n")
    return 0


OWNER_EXISTS = "the platform already has its Owner"


def create_owner(username, email, name, stdin, out, err):
    with _context(), database.connection_context():
        if accounts.first_user_exists():
            out.write(OWNER_EXISTS + "\n")
            return 0
        password = _read_password(stdin, err)
        try:
            data = validated(
                FirstUserSchema(), {"username": username, "email": email, "name": name, "password": password}
            )
            user = accounts.create_first(data["username"], data["email"], data["name"], data["password"])
        except Failure as exc:
            if exc.status == 409 and accounts.first_user_exists():  # another run got there first
                out.write(OWNER_EXISTS + "\n")
                return 0
            err.write(f"error: {_described(exc)}\n")
            return 1
    out.write(f"Created the Owner {user.username} ({user.id}).\n")
    return 0


def _described(exc):
    problems = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in (exc.extra.get("fields") or {}).items())
    return exc.message + (" " + problems if problems else "")


def _username(parser):
    parser.add_argument("username")


def _account(parser):
    parser.add_argument("--username", required=True)
    parser.add_argument("--email", required=True)
    parser.add_argument("--name", default="")


commands = CommandLine("python -m app.workspace", __doc__)
commands.add(
    "reset-password",
    "set a user's password and revoke their sessions",
    lambda args, s: reset_password(args.username, s.stdin, s.out, s.err),
    _username,
)
commands.add(
    "create-admin",
    "create an Owner account (the first user, if none)",
    lambda args, s: create_admin(args.username, args.email, args.name, s.stdin, s.out, s.err),
    _account,
)
commands.add(
    "create-owner",
    "create the initial Owner, unless the platform has one",
    lambda args, s: create_owner(args.username, args.email, args.name, s.stdin, s.out, s.err),
    _account,
)
commands.add_copy_to_postgres(
    lambda: CopyPlan(HISTORY, WorkspaceSettings.from_env(config.data_dir("workspace")).database_url)
)
commands.add_contract(lambda: (HISTORY, WorkspaceSettings.from_env(config.data_dir("workspace")).database_url))


def main(argv=None, stdin=sys.stdin, out=sys.stdout, err=sys.stderr):
    return commands.main(argv, stdin, out, err)
