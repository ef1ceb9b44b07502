"""The README's screenshots: each built service's main page in Debian's Chromium,
through nginx, on fresh data seeded as `make run` seeds it.

    .venv/bin/python -m devtools.screenshots [service ...]   # writes docs/screenshots/<service>.png

Not app code and not a test: run by hand after a page changes.
"""

import sys
import tempfile
from pathlib import Path

from app import built_services
from devtools import nginx, run, services

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
# The page a person lands on; the workspace's dashboard needs a session, so its login page.
PAGES = {"workspace": "/login", "notebook": "/docs"}
HEIGHTS = {"audio": 120}  # an API only: its capabilities document is one line


def main(names=None):
    from playwright.sync_api import sync_playwright

    TARGET.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for name in names or built_services():
            data_dir = Path(scratch) / name
            data_dir.mkdir()
            run.PREPARERS.get(name, lambda d: None)(data_dir)
            service = services.start(name, data_dir, env=run.ENVIRONMENTS.get(name))
            proxy = None
            try:
                run.SEEDERS.get(name, lambda s: None)(service)
                proxy = nginx.start(
                    Path(scratch) / f"{name}-nginx",
                    None,
                    {name: f"127.0.0.1:{service.port}"},
                    variables={
                        "wizard_uploads_dir": str(data_dir / "uploads"),
                        "wizard_lists_dir": str(data_dir / "lists"),
                    },
                )
                page = browser.new_page(viewport={"width": 1200, "height": HEIGHTS.get(name, 800)})
                path = PAGES.get(name) or run.HOME_PATHS.get(name, "/")
                page.goto(f"http://{proxy.host(name)}:{proxy.port}{path}", wait_until="networkidle")
                page.screenshot(path=str(TARGET / f"{name}.png"))
                page.close()
                print(f"{name}: docs/screenshots/{name}.png")
            finally:
                if proxy is not None:
                    proxy.stop()
                service.stop()
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
