"""Prompt wizard (spec 002): collections of wizards, blueprints, prompts and likes,
uploads, AI text and image generation, and live collection events. Identity comes
from the reverse proxy (`Remote-User`, `Remote-Groups`).

Routes, each module with its own blueprint: `pages` (the HTML pages, with the static
files and templates), `api` (identity, collections, likes, events; its hook asks every
/api/ path for an identity), `ai` (text and image generation) and `uploads`."""

import logging

from app.common.errors import error_with_field

log = logging.getLogger("bundle.wizard")

error_body = error_with_field  # {"error": message, "field"?: name}


def init_app(app):
    from app.common import readiness
    from app.common.db import bind_to_requests
    from app.wizard import ai, api, pages, public_lists, uploads
    from app.wizard.generation import Generator
    from app.wizard.migrations import HISTORY, open_database
    from app.wizard.models import database
    from app.wizard.seed import seed_global_wizards
    from app.wizard.settings import UPLOAD_LIMIT, WizardSettings

    settings = WizardSettings.from_env(app.config["DATA_DIR"])
    app.config["WIZARD"] = settings
    app.extensions["wizard_generator"] = Generator.from_env()
    # The largest body of any route (an upload), with room for the multipart framing.
    app.config["MAX_CONTENT_LENGTH"] = UPLOAD_LIMIT + 64 * 1024
    open_database(settings.database_url)
    seed_global_wizards()
    public_lists.enable(settings.lists_dir)
    readiness.register(app, database, HISTORY, redis=True)  # before bind_to_requests: /readyz goes first
    bind_to_requests(app, database, no_connection=api.NO_CONNECTION | ai.NO_CONNECTION)
    if settings.allow_test_identity:
        log.warning(
            "WIZ_ALLOW_TEST_IDENTITY=1: X-Wiz-Test-User is honoured on direct loopback requests; "
            "never enable this in production"
        )
    for blueprint in (pages.bp, api.bp, ai.bp, uploads.bp):
        app.register_blueprint(blueprint)
