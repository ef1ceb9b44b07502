"""Makes PostgreSQL's login roles and databases of the bundle match the secrets file.

    python3 bundle_pg_roles.py SECRETS_FILE [--run-as postgres] [--port N] [--monitor] NAME=SECRET ...

For each NAME=SECRET: a login role NAME whose password is the secrets file's SECRET,
and a database NAME owned by it that no one else may connect to (CONNECT and TEMP
revoked from PUBLIC; pg_hba.conf names each database's role only). A role whose
stored SCRAM verifier does not match the secret gets a new one (the secret changed).
With --monitor (the monitoring role's postgres exporter): each NAME is a login role
member of pg_monitor (it reads the statistics views, no table of the services) with no
database of its own.

The password never reaches the server, its logs or a command line: the SCRAM-SHA-256
verifier is computed here (RFC 5802/7677, as PostgreSQL stores it) and handed to
psql on stdin. Prints "changed" when it changed anything, nothing else: never a
secret. Standard library only, it runs with the host's python3; psql does the talking
(as --run-as through runuser, connection settings from --port and PG* variables).
"""

import argparse
import base64
import hashlib
import hmac
import json
import re
import secrets
import subprocess
import sys

ITERATIONS = 4096  # PostgreSQL's scram_iterations default
NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _b64(raw):
    return base64.b64encode(raw).decode()


def _keys(password, salt, iterations):
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def _check_password(password):
    # PostgreSQL runs SASLprep on the password first, which leaves printable ASCII as it is.
    if not password or not all(33 <= ord(c) < 127 for c in password):
        raise SystemExit("bundle_pg_roles: a password must be printable ASCII without spaces")


def scram_verifier(password, salt=None, iterations=ITERATIONS):
    """PostgreSQL's stored form: SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>."""
    _check_password(password)
    salt = secrets.token_bytes(16) if salt is None else salt
    stored_key, server_key = _keys(password, salt, iterations)
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def verifier_matches(verifier, password):
    """Whether a stored SCRAM verifier is that of `password` (False for md5 or none)."""
    match = re.fullmatch(r"SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)", verifier or "")
    if not match:
        return False
    _check_password(password)
    try:
        salt = base64.b64decode(match.group(2), validate=True)
        stored_key, server_key = _keys(password, salt, int(match.group(1)))
        wanted = base64.b64decode(match.group(3), validate=True), base64.b64decode(match.group(4), validate=True)
    except ValueError:
        return False
    return hmac.compare_digest(stored_key, wanted[0]) and hmac.compare_digest(server_key, wanted[1])


class Psql:
    def __init__(self, run_as=None, port=None):
        self.prefix = ["runuser", "-u", run_as, "--"] if run_as else []
        self.options = ["-p", str(port)] if port else []

    def __call__(self, sql, database="postgres"):
        """Runs `sql` (on stdin, never on the command line); returns the rows, fields split on '|'."""
        command = [*self.prefix, "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", *self.options, "-d", database]
        done = subprocess.run(command, input=sql, capture_output=True, text=True, cwd="/", timeout=120)
        if done.returncode != 0:
            # psql's message names the statement's error, never the verifier's secret part.
            raise SystemExit(
                f"bundle_pg_roles: psql failed ({done.returncode}): "
                f"{re.sub(r'SCRAM-SHA-256[^ ]*', 'SCRAM-SHA-256$…', done.stderr.strip())}"
            )
        return [line.split("|") for line in done.stdout.splitlines() if line]


def ensure_login(psql, name, password):
    """Brings one login role and its password in line; returns whether it changed anything."""
    rows = psql(f"SELECT rolcanlogin, coalesce(rolpassword, '') FROM pg_authid WHERE rolname = '{name}'")
    if not rows:
        psql(f"CREATE ROLE {name} LOGIN PASSWORD '{scram_verifier(password)}'")
        return True
    if rows[0][0] != "t" or not verifier_matches(rows[0][1], password):
        psql(f"ALTER ROLE {name} LOGIN PASSWORD '{scram_verifier(password)}'")
        return True
    return False


def ensure_monitor(psql, name, password):
    """Brings one login role of pg_monitor in line (no database); returns whether it changed anything."""
    changed = ensure_login(psql, name, password)
    if psql(f"SELECT pg_has_role('{name}', 'pg_monitor', 'MEMBER')") != [["t"]]:
        psql(f"GRANT pg_monitor TO {name}")
        changed = True
    return changed


def ensure(psql, name, password):
    """Brings one role and its database in line; returns whether it changed anything."""
    changed = ensure_login(psql, name, password)
    rows = psql(
        f"SELECT pg_get_userbyid(datdba), has_database_privilege('public', datname, 'CONNECT'),"
        f" has_database_privilege('public', datname, 'TEMPORARY') FROM pg_database"
        f" WHERE datname = '{name}'"
    )
    if not rows:
        psql(f"CREATE DATABASE {name} OWNER {name} ENCODING 'UTF8' TEMPLATE template0")
        rows = [[name, "t", "t"]]
        changed = True
    owner, public_connect, public_temp = rows[0]
    if owner != name:
        psql(f"ALTER DATABASE {name} OWNER TO {name}")
        changed = True
    if "t" in (public_connect, public_temp):
        psql(f"REVOKE CONNECT, TEMPORARY ON DATABASE {name} FROM PUBLIC")
        changed = True
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("secrets_file")
    parser.add_argument("specs", nargs="+", metavar="NAME=SECRET")
    parser.add_argument("--run-as", help="run psql as this user (runuser), e.g. postgres")
    parser.add_argument("--port", type=int, help="the server's port (else PGPORT or psql's default)")
    parser.add_argument("--monitor", action="store_true", help="login roles of pg_monitor, no database of their own")
    args = parser.parse_args(argv)
    with open(args.secrets_file) as handle:
        stored = json.load(handle)
    wanted = []
    for spec in args.specs:
        name, _, secret = spec.partition("=")
        if not NAME.match(name) or not secret:
            parser.error(f"{spec!r} is not NAME=SECRET with NAME a lower-case SQL identifier")
        if secret not in stored:
            raise SystemExit(f"bundle_pg_roles: {args.secrets_file} has no {secret}")
        wanted.append((name, stored[secret]))
    psql = Psql(args.run_as, args.port)
    make = ensure_monitor if args.monitor else ensure
    changed = False
    for name, password in wanted:
        changed = make(psql, name, password) or changed
    if changed:
        print("changed")


if __name__ == "__main__":
    sys.exit(main())
