"""Makes the PostgreSQL login role of the postgres exporter match the secrets file.

    python3 bundle_pg_monitor.py SECRETS_FILE NAME=SECRET [--run-as postgres] [--port N]

A login role NAME, member of pg_monitor (it reads the statistics views, no table of
the services), with the secrets file's SECRET as its password, and no database of
its own (the exporter connects to `postgres`). The password never reaches the server's
logs or a command line: its SCRAM-SHA-256 verifier is made here, by the data role's
bundle_pg_roles.py, whose psql runner this uses. Prints "changed" when it changed
anything, nothing else. Standard library only, it runs with the host's python3.
"""

import argparse
import json
import re
import sys
from pathlib import Path

# The data role's helper (the same checkout: ops/roles/data/files).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data" / "files"))

from bundle_pg_roles import Psql, scram_verifier, verifier_matches

NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def ensure(psql, name, password):
    """Brings the role in line; returns whether it changed anything."""
    changed = False
    rows = psql(f"SELECT rolcanlogin, coalesce(rolpassword, '') FROM pg_authid WHERE rolname = '{name}'")
    if not rows:
        psql(f"CREATE ROLE {name} LOGIN PASSWORD '{scram_verifier(password)}'")
        changed = True
    elif rows[0][0] != "t" or not verifier_matches(rows[0][1], password):
        psql(f"ALTER ROLE {name} LOGIN PASSWORD '{scram_verifier(password)}'")
        changed = True
    if psql(f"SELECT pg_has_role('{name}', 'pg_monitor', 'MEMBER')") != [["t"]]:
        psql(f"GRANT pg_monitor TO {name}")
        changed = True
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("secrets_file")
    parser.add_argument("spec", metavar="NAME=SECRET")
    parser.add_argument("--run-as", help="run psql as this user (runuser), e.g. postgres")
    parser.add_argument("--port", type=int, help="the server's port (else PGPORT or psql's default)")
    args = parser.parse_args(argv)
    name, _, secret = args.spec.partition("=")
    if not NAME.match(name) or not secret:
        parser.error(f"{args.spec!r} is not NAME=SECRET with NAME a lower-case SQL identifier")
    with open(args.secrets_file) as handle:
        stored = json.load(handle)
    if secret not in stored:
        raise SystemExit(f"bundle_pg_monitor: {args.secrets_file} has no {secret}")
    if ensure(Psql(args.run_as, args.port), name, stored[secret]):
        print("changed")


if __name__ == "__main__":
    sys.exit(main())
