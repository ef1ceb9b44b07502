"""The prompt wizard's configuration, read once from the environment at start."""
import os
from dataclasses import dataclass

from app.common.config import env_bool, env_str

UPLOAD_LIMIT = 8 * 1024 * 1024      # the spec's maximum upload size


@dataclass(frozen=True)
class WizardSettings:
    database_url: str            # DATABASE_URL, default sqlite:///$DATA_DIR/wizard.db
    uploads_dir: str             # $DATA_DIR/uploads (nginx serves the same folder)
    lists_dir: str               # $DATA_DIR/lists (collection lists nginx sends: list_files.py)
    allow_test_identity: bool    # WIZ_ALLOW_TEST_IDENTITY=1: X-Wiz-Test-User from loopback

    @classmethod
    def from_env(cls, data_dir):
        return cls(
            database_url=env_str("DATABASE_URL", "sqlite:///" + os.path.join(data_dir, "wizard.db")),
            uploads_dir=os.path.join(data_dir, "uploads"),
            lists_dir=os.path.join(data_dir, "lists"),
            allow_test_identity=env_bool("WIZ_ALLOW_TEST_IDENTITY"),
        )
