"""Browser tests: Debian's Chromium, headless, driven by Playwright, on pages reached
through a real nginx rendered from nginx/ (identity headers set by nginx as the
production sites set them).

Fixtures:
- `browser`: one Chromium for the session (skipped loudly where it is not installed).
- `context`: a fresh browser context (cookies, storage) per test; `page`: a tab in it.
  Every page of the context is saved as a screenshot under test-artifacts/ when the
  test ends, whatever its result: test-artifacts/<test name>[-<n>].png.
- `site(service, env=None, variables=None, data_dir=None, listen_port=None)`: starts the service under
  gunicorn and an nginx in front; returns a Site with `.url` (http://<service>.localhost:PORT),
  `.service` (the RunningService), `.api` (its direct address), `.proxy`,
  `.restart_service()`. Stopped at the end of the test.
"""

from pathlib import Path

import pytest

from devtools import nginx, services
from tests.support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, Site, artifact_name


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"BROWSER TESTS SKIPPED: {CHROMIUM} is missing (Debian package chromium; make test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def context(browser, request):
    ctx = browser.new_context(viewport={"width": 1200, "height": 800})
    ctx.set_default_timeout(10_000)
    yield ctx
    ARTIFACTS.mkdir(exist_ok=True)
    for index, open_page in enumerate(ctx.pages):
        suffix = f"-{index + 1}" if index else ""
        try:
            open_page.screenshot(path=str(ARTIFACTS / f"{artifact_name(request)}{suffix}.png"), full_page=True)
        except Exception as exc:  # a screenshot must not hide the test's own result
            print(f"no screenshot of page {index}: {exc}")
    ctx.close()


@pytest.fixture
def page(context):
    return context.new_page()


@pytest.fixture
def site(tmp_path_factory):
    started = []

    def start(name, env=None, variables=None, data_dir=None, hosts=None, listen_port=None):
        data_dir = data_dir or tmp_path_factory.mktemp(f"browser-{name}")
        service = services.start(name, data_dir, env=env)
        proxy = nginx.start(
            tmp_path_factory.mktemp(f"browser-{name}-nginx"),
            listen_port,
            upstreams={name: f"127.0.0.1:{service.port}"},
            hosts=hosts,
            variables=variables or {},
        )
        started.append(Site(service, proxy, name, env))
        return started[-1]

    yield start
    for running in reversed(started):
        running.proxy.stop()
        running.service.stop()
