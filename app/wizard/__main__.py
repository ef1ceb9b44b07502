"""Host-side commands of the wizard. They work on the service's database directly
(the same DATA_DIR / DATABASE_URL as the service) and need no running server.

    python -m app.wizard copy-to-postgres postgresql://USER:PASSWORD@HOST/DB
"""
import argparse
import sys

from app.common import config, copy_to_postgres
from app.wizard.schema import HISTORY
from app.wizard.settings import WizardSettings


def main(argv=None, out=sys.stdout, err=sys.stderr):
    parser = argparse.ArgumentParser(prog="python -m app.wizard", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    copy = commands.add_parser("copy-to-postgres", help="copy this SQLite database into an empty PostgreSQL one")
    copy.add_argument("url", help="postgresql://user:password@host:port/database")
    args = parser.parse_args(argv)
    try:
        settings = WizardSettings.from_env(config.data_dir("wizard"))
    except config.ConfigError as exc:
        err.write(f"error: {exc}\n")
        return 2
    return copy_to_postgres.run(HISTORY, settings.database_url, args.url, out, err)


if __name__ == "__main__":
    sys.exit(main())
