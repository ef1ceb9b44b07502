"""The notebook's blueprint: the route modules register on it, and init_app serves it
at the spec's paths and again under /api."""
from flask import Blueprint

bp = Blueprint("notebook", "app.notebook", static_folder="static", static_url_path="/docs/assets")
