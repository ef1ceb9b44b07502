"""Where every process of the bundle logs: one line a record to stderr (journald in
production). No Flask here: job workers and commands set it up too."""
import logging
import sys


def configure_logging():
    root = logging.getLogger()
    if not any(getattr(h, "_bundle", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        handler._bundle = True
        root.addHandler(handler)
    root.setLevel(logging.INFO)
