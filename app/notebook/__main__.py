import sys

from app.notebook.cli import main

sys.exit(main())
