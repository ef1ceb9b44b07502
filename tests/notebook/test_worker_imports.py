"""The job worker is a process of its own: what it imports brings in no Flask, no
werkzeug and no route module (pyproject.toml's import contract says the same of the
modules' own imports; this also counts what packages' __init__ files import)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER_IMPORTS = """
import sys
from app.notebook import cli, settings  # what `worker` loads
from app.notebook.core import migrations, models
from app.notebook.worker import jobs, processing
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("flask", "werkzeug")
                or m == "app.notebook.routes" or m.startswith("app.notebook.routes."))
print(" ".join(loaded))
"""


def test_the_job_worker_imports_no_flask_and_no_route_module():
    run = subprocess.run(
        [sys.executable, "-c", WORKER_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip() == "", f"the worker loads: {run.stdout.strip()}"
