"""Host-side commands of the wizard. They work on the service's database directly
(the same DATA_DIR / DATABASE_URL as the service) and need no running server.

    python -m app.wizard copy-to-postgres postgresql://USER:PASSWORD@HOST/DB
    python -m app.wizard contract [--dry-run]    the pending contract schema steps
"""

import sys

from app.common import config
from app.common.cli import CommandLine, CopyPlan
from app.wizard.migrations import HISTORY
from app.wizard.settings import WizardSettings

commands = CommandLine("python -m app.wizard", __doc__)
commands.add_copy_to_postgres(
    lambda: CopyPlan(HISTORY, WizardSettings.from_env(config.data_dir("wizard")).database_url)
)
commands.add_contract(lambda: (HISTORY, WizardSettings.from_env(config.data_dir("wizard")).database_url))


def main(argv=None, out=sys.stdout, err=sys.stderr):
    return commands.main(argv, out=out, err=err)


if __name__ == "__main__":
    sys.exit(main())
