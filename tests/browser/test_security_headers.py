"""Security headers on every answer of every service, as the public gets them through
the real nginx sites, and each service's pages in headless Chromium under them: the
Content-Security-Policy blocks nothing our own pages need (Chromium reports every
violation as a `securitypolicyviolation` event, counted here)."""

import pytest
import requests
from playwright.sync_api import expect

from devtools import services
from tests.support.decks import copy_sample_deck
from tests.support.workspace import OWNER, AgentProcess

# Each service's site, with what it needs to start, and a page and a JSON answer.
SITES = {
    "workspace": {"env": {}, "page": "/login", "json": "/api/v2/buildinfo"},
    "decks": {"env": {}, "page": "/", "json": "/api/decks"},
    "notebook": {"env": {"NOTEBOOK_ALLOW_NO_PASSWORD": "1"}, "page": "/docs", "json": "/api/notebooks"},
    "audio": {"env": {}, "page": None, "json": "/api/audio/health"},
    "wizard": {"env": {}, "page": "/", "json": "/api/wizards"},
}

VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) => {
  (window.__cspViolations = window.__cspViolations || []).push(`${e.effectiveDirective} ${e.blockedURI}`);
});"""


def start_site(site, tmp_path_factory, name):
    data_dir = tmp_path_factory.mktemp(f"headers-{name}")
    variables = {}
    if name == "wizard":
        variables = {"wizard_uploads_dir": str(data_dir / "uploads"), "wizard_lists_dir": str(data_dir / "lists")}
    return site(name, env=SITES[name]["env"], data_dir=data_dir, variables=variables)


def through_nginx(running, path, **kwargs):
    return requests.get(running.proxy.url + path, headers=running.proxy.headers(running.name), timeout=10, **kwargs)


def assert_security_headers(response):
    headers = response.headers
    assert headers.get("X-Content-Type-Options") == "nosniff", (response.url, dict(headers))
    assert headers.get("X-Frame-Options") == "DENY"
    assert headers.get("Referrer-Policy") == "same-origin"
    policy = headers.get("Content-Security-Policy", "")
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ):
        assert directive in policy, (response.url, policy)
    assert "unsafe-eval" not in policy and "script-src 'self' 'unsafe-inline'" not in policy


@pytest.mark.parametrize("name", list(SITES))
def test_every_answer_carries_the_security_headers(site, tmp_path_factory, name):
    running = start_site(site, tmp_path_factory, name)
    wanted = SITES[name]
    answers = [through_nginx(running, wanted["json"]), through_nginx(running, "/no/such/route")]
    if wanted["page"]:
        answers.append(through_nginx(running, wanted["page"]))
    for response in answers:
        assert response.status_code in (200, 401, 404), (response.url, response.status_code, response.text[:200])
        assert_security_headers(response)
    assert answers[1].status_code == 404 and answers[1].headers["Content-Type"].startswith("application/json")


def assert_runs_under_the_policy(page, url, ready):
    """Open `url`, wait for the locator `ready(page)` to be in the page (the page's script
    ran), and fail on any CSP violation Chromium reported meanwhile."""
    messages = []
    page.on(
        "console", lambda message: messages.append(message.text) if "Content Security Policy" in message.text else None
    )
    page.goto(url)
    expect(ready(page)).to_be_attached()
    violations = page.evaluate("window.__cspViolations || []") + messages
    assert violations == [], f"{url}: {violations}"


def test_the_workspace_pages_run_under_the_policy(site, context, tmp_path):
    port = services.free_port()  # the access URL names nginx's port: the terminal's websocket checks its Origin
    running = site("workspace", listen_port=port, env={"WORKSPACE_ACCESS_URL": f"http://workspace.localhost:{port}"})
    context.add_init_script(VIOLATIONS)
    tab = context.new_page()
    assert_runs_under_the_policy(tab, running.url + "/login", lambda p: p.get_by_label("Email"))
    token = requests.post(running.api + "/api/v2/users/first", json=OWNER, timeout=10).json()["session_token"]
    created = requests.post(
        running.api + "/api/v2/users/me/workspaces",
        headers={"Workspace-Session-Token": token},
        json={"name": "dev", "agents": [{"name": "main"}]},
        timeout=10,
    )
    assert created.status_code == 201, created.text
    agent = AgentProcess(tmp_path, running.api, created.json()["agents"][0]["token"])
    try:
        context.add_cookies([{"name": "workspace_session_token", "value": token, "domain": running.host, "path": "/"}])
        tab = context.new_page()
        assert_runs_under_the_policy(tab, running.url + "/", lambda p: p.locator("#username"))
        tab = context.new_page()
        assert_runs_under_the_policy(tab, running.url + "/@owner/dev.main/terminal", lambda p: p.locator(".xterm-rows"))
        expect(tab.locator("#terminal-status")).to_have_text("connected", timeout=20_000)
        tab.locator("#terminal").click()
        tab.keyboard.type("echo csp-$((6*7))\n")
        expect(tab.locator(".xterm-rows")).to_contain_text("csp-42")
        assert tab.evaluate("window.__cspViolations || []") == []
    finally:
        agent.stop()


def test_the_deck_pages_run_under_the_policy(site, context, tmp_path):
    data_dir = tmp_path / "decks"
    data_dir.mkdir()
    body = copy_sample_deck(data_dir)
    running = site("decks", data_dir=data_dir)
    requests.post(f"{running.api}/api/decks/import", json=body, timeout=10).raise_for_status()
    created = requests.post(f"{running.api}/api/sessions", json={"deck_id": "welcome"}, timeout=10)
    created.raise_for_status()
    context.add_init_script(VIOLATIONS)
    tab = context.new_page()
    assert_runs_under_the_policy(tab, running.url + "/", lambda p: p.locator("#decks-list li").first)
    tab = context.new_page()
    assert_runs_under_the_policy(
        tab, f"{running.url}/review/{created.json()['id']}", lambda p: p.locator('#conn[data-state="live"]')
    )


def test_the_notebook_api_docs_run_under_the_policy(site, context, tmp_path_factory):
    running = start_site(site, tmp_path_factory, "notebook")
    context.add_init_script(VIOLATIONS)
    tab = context.new_page()
    # Swagger UI rendered the document: its operations are listed.
    assert_runs_under_the_policy(tab, running.url + "/docs", lambda p: p.locator(".opblock").first)


def test_the_wizard_pages_run_under_the_policy(site, context, tmp_path_factory):
    running = start_site(site, tmp_path_factory, "wizard")
    context.add_init_script(VIOLATIONS)
    for path in ("/", "/blueprints", "/library"):
        tab = context.new_page()
        assert_runs_under_the_policy(tab, running.url + path, lambda p: p.locator('#live[data-state="live"]'))
