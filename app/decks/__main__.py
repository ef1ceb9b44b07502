import sys

from app.decks.cli import main

sys.exit(main())
