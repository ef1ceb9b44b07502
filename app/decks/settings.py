"""The deck review service's configuration, read once from the environment at start.

The spec names one variable, DATA_DIR (shared by every service); the others are ours.
Each is declared once below (name, default, bounds, meaning); the reference in
docs/services/decks.md is written from these declarations (devtools.reference)."""

from app.common import config
from app.common.config import Integer

# The largest body the service takes, as at the proxy: the scribble upload.
MAX_BODY_BYTES = 64 * 1024 * 1024

VARIABLES = config.Variables("decks", includes=(config.SHARED,))
# A session's event log grows to this size at most; past it an append answers 507.
MAX_LOG_BYTES = VARIABLES.add(
    Integer(
        name="DECKS_MAX_LOG_BYTES",
        default=64 * 1024 * 1024,
        minimum=4096,
        doc="The largest a review session's event log may grow, in bytes; past it an append answers 507 "
        "and nothing is stored.",
    )
)
