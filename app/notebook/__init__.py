"""Research notebook (spec 001, part A): notebooks, sources processed by background
jobs (extraction, chunking, embeddings), notes, commands, full-text and vector
search, and interactive documentation. Modelled on Open Notebook: every route is
served at the spec's path and again under /api.

Layers, each importing only those below it (import contracts in pyproject.toml):
routes/ (each route module defines its blueprint; init_app registers them), worker/
(the job worker: no Flask, no route module), core/ (data and shared logic), llm/
(providers), ingest/ (extraction, chunking, uploads, the SSRF guard)."""

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
    from app.common import metrics, readiness
    from app.common.db import bind_to_requests
    from app.notebook.core.migrations import HISTORY, open_database
    from app.notebook.core.models import database
    from app.notebook.routes import (
        ask,
        chat,
        commands,
        credentials,
        docs,
        embedding,
        model_config,
        notebooks,
        notes,
        podcasts,
        providers,
        search,
        source_chat,
        sources,
        system,
        transformations,
        web,
    )
    from app.notebook.routes import settings as settings_routes
    from app.notebook.settings import NotebookSettings
    from app.notebook.worker.backlog import backlog
    from app.notebook.worker.jobs import JobQueue

    settings = NotebookSettings.from_env(app.config["DATA_DIR"])
    app.config["NOTEBOOK"] = settings
    # Uploads are streamed to disk by the form parser; the cap (413) is checked per route.
    # Text fields of a form (a text source's content) are held in memory up to this.
    app.config["MAX_FORM_MEMORY_SIZE"] = settings.max_text_bytes
    open_database(settings.database_url)
    app.extensions["notebook_jobs"] = JobQueue(settings)
    metrics.on_scrape(backlog)  # the job queue's backlog, read from the database at each scrape
    web.register(app, settings)  # /readyz is public (web.PUBLIC_ENDPOINTS)
    readiness.register(app, database, HISTORY, redis=True)  # before bind_to_requests: /readyz goes first
    bind_to_requests(app, database, no_connection=system.NO_CONNECTION)

    # Every route module's blueprint, at the spec's paths and again under /api.
    for module in (
        ask,
        chat,
        commands,
        credentials,
        docs,
        embedding,
        model_config,
        notebooks,
        notes,
        podcasts,
        providers,
        search,
        source_chat,
        settings_routes,
        sources,
        system,
        transformations,
    ):
        app.register_blueprint(module.bp)
        app.register_blueprint(module.bp, url_prefix="/api", name=f"{module.bp.name}_api")
    if not settings.auth_enabled:
        log.warning("NOTEBOOK_PASSWORD is not set: the notebook answers every client (no authentication)")
