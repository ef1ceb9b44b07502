import sys

from app.workspace.cli import main

sys.exit(main())
