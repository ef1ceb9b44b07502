"""Open Notebook's application settings (GET/PUT /settings), kept in the database
(core/app_settings.py says which ones change what the notebook does)."""

from flask import Blueprint

from app.notebook.core import app_settings
from app.notebook.core.models import write_transaction
from app.notebook.routes.http import body
from app.notebook.routes.payloads import SettingsUpdate

bp = Blueprint("settings", __name__)


@bp.get("/settings")
def read_settings():
    """Every setting, its default when never set."""
    return app_settings.current()


@bp.put("/settings")
def update_settings():
    """Change the settings given (null or left out: unchanged); every setting after the change. Used here:
    default_embedding_option (a source added without `embed`) and auto_delete_files (an upload's file once
    processed); the others are kept and answered only."""
    data = body(SettingsUpdate())
    changes = {key: value for key, value in data.items() if value is not None}
    with write_transaction():
        return app_settings.update(changes)
