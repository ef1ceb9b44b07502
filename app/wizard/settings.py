"""The prompt wizard's configuration, read once from the environment at start.

Each variable is declared once below (name, default, bounds, meaning); the reference
in docs/services/wizard.md is written from these declarations (devtools.reference)."""

import os
from dataclasses import dataclass

from app.common import config
from app.common.config import Flag, Integer, Seconds, Text

UPLOAD_LIMIT = 8 * 1024 * 1024  # the spec's maximum upload size

VARIABLES = config.Variables("wizard", includes=(config.SHARED, config.OUTBOUND))
DATABASE_URL = VARIABLES.add(
    Text(
        name="DATABASE_URL",
        shown_default="`sqlite:///$DATA_DIR/wizard.db`",
        values="sqlite:/// or postgresql:// URL (several hosts too: postgresql://user:password@h1:5432,h2:5432/db)",
        doc="The wizard's database. A secret when it holds a password.",
    )
)
ALLOW_TEST_IDENTITY = VARIABLES.add(
    Flag(
        name="WIZ_ALLOW_TEST_IDENTITY",
        doc="Honour the X-Wiz-Test-User header on requests straight from loopback (tests only).",
    )
)
# Read by app.wizard.generation (Generator.from_env).
AI_BASE_URL = VARIABLES.add(
    Text(
        name="WIZ_AI_BASE_URL",
        values="http(s) URL",
        doc="The base of the OpenAI-compatible API that generates text and images; blank: generation is off.",
    )
)
AI_API_KEY = VARIABLES.add(
    Text(
        name="WIZ_AI_API_KEY",
        values="printable ASCII, at most 512 characters",
        doc="The provider's API key. A secret: never logged nor answered.",
    )
)
TEXT_MODEL = VARIABLES.add(
    Text(name="WIZ_TEXT_MODEL", doc="The model of text generation; blank: text generation is off.")
)
IMAGE_MODEL = VARIABLES.add(
    Text(name="WIZ_IMAGE_MODEL", doc="The model of image generation; blank: image generation is off.")
)
AI_PROVIDER = VARIABLES.add(
    Text(name="WIZ_AI_PROVIDER", default="openai", doc="The provider's name, reported with each generated image.")
)
AI_TIMEOUT = VARIABLES.add(Seconds(name="WIZ_AI_TIMEOUT", default=60.0, doc="A whole generation call's deadline."))
AI_CONCURRENCY = VARIABLES.add(
    Integer(name="WIZ_AI_CONCURRENCY", default=4, minimum=1, maximum=256, doc="Generation calls at once, per worker.")
)


# Each field is the value of the variable its comment names (declared above, with its meaning).
@dataclass(frozen=True)
class WizardSettings:
    database_url: str  # DATABASE_URL
    uploads_dir: str  # $DATA_DIR/uploads (nginx serves the same folder)
    lists_dir: str  # $DATA_DIR/lists (collection lists nginx sends: list_files.py)
    allow_test_identity: bool  # WIZ_ALLOW_TEST_IDENTITY

    @classmethod
    def from_env(cls, data_dir):
        return cls(
            database_url=DATABASE_URL.read("sqlite:///" + os.path.join(data_dir, "wizard.db")),
            uploads_dir=os.path.join(data_dir, "uploads"),
            lists_dir=os.path.join(data_dir, "lists"),
            allow_test_identity=ALLOW_TEST_IDENTITY.read(),
        )
