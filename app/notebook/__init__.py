"""Research notebook (spec 001, part A): notebooks, sources processed by background
jobs (extraction, chunking, embeddings), notes, commands, full-text and vector
search, and interactive documentation. Modelled on Open Notebook: every route is
served at the spec's path and again under /api.

The routes are in the modules that register on `app.notebook.blueprint.bp`; the job
worker's modules (processing, jobs, and the Flask-free ones they use) import no Flask
and no route module (an import contract in pyproject.toml checks it)."""
import logging

log = logging.getLogger("bundle.notebook")


def error_body(status, message, extra):
    """FastAPI's shape, as Open Notebook answers: {"detail": "..."}; validation
    errors also name the field."""
    body = {"detail": message}
    if extra.get("field"):
        body["field"] = extra["field"]
    return body


def init_app(app):
    from app.common.db import bind_to_requests
    from app.notebook import (  # noqa: F401  (importing a route module registers its routes)
        ask,
        chat,
        commands,
        credentials,
        docs,
        model_config,
        notebooks,
        notes,
        podcasts,
        search,
        sources,
        system,
        transformations,
        web,
    )
    from app.notebook.blueprint import bp
    from app.notebook.jobs import JobQueue
    from app.notebook.models import database
    from app.notebook.schema import open_database
    from app.notebook.settings import NotebookSettings

    settings = NotebookSettings.from_env(app.config["DATA_DIR"])
    app.config["NOTEBOOK"] = settings
    # Uploads are streamed to disk by the form parser; the cap (413) is checked per route.
    # Text fields of a form (a text source's content) are held in memory up to this.
    app.config["MAX_FORM_MEMORY_SIZE"] = settings.max_text_bytes
    open_database(settings.database_url)
    app.extensions["notebook_jobs"] = JobQueue(settings)
    web.register(app, settings)
    bind_to_requests(app, database)

    app.register_blueprint(bp)
    app.register_blueprint(bp, url_prefix="/api", name="notebook_api")
    if not settings.auth_enabled:
        log.warning("NOTEBOOK_PASSWORD is not set: the notebook answers every client (no authentication)")
