"""The providers the notebook can call (GET /providers: what Open Notebook's settings
page lists, one card each) and which optional extraction runtimes it has
(GET /capabilities: the UI offers Docling and Crawl4AI only when they are)."""

from flask import Blueprint

from app.notebook import llm
from app.notebook.routes.credentials import env_configured

bp = Blueprint("providers", __name__)


@bp.get("/providers")
def list_providers():
    """Each provider: its name, what it is called, what it serves, where its keys are
    made, and whether its environment variables configure it."""
    return [
        {
            "name": name,
            "display_name": display_name,
            "modalities": [kind for kind in llm.MODEL_TYPES if kind in llm.CAPABILITIES[name]],
            "docs_url": docs_url,
            "env_configured": env_configured(name),
        }
        for name, (display_name, docs_url) in llm.PROVIDER_INFO.items()
    ]


@bp.get("/capabilities")
def capabilities():
    """Our extraction is built in (app.notebook.ingest): neither of Open Notebook's
    opt-in runtimes is here, so the UI offers neither engine."""
    return {"docling_available": False, "crawl4ai_available": False, "crawl4ai_remote_configured": False}
