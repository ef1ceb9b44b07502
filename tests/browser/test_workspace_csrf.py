"""Cross-site attacks on the workspace platform in a real browser, through nginx: an
attacker's page on another origin (a plain HTTP server of the test's own) makes the
victim's Chromium post the sign-in and sign-out forms and open the terminal's
websocket. Two attackers: another site (127.0.0.1), and a page of the same site on
another origin (workspace.localhost on another port: SameSite=Lax cookies go there,
as they go to any sibling host of the platform)."""

import html
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from playwright.sync_api import expect

from devtools import services
from tests.support.browser import WORKSPACE_OWNER, sign_in_to_the_workspace
from tests.support.workspace import AgentProcess

OWNER = WORKSPACE_OWNER
MALLORY = {"email": "mallory@example.com", "username": "mallory", "password": "Evil-plan-7731x"}
COOKIE = "workspace_session_token"


class Attacker:
    """Pages served from another origin: `page(path, body)` adds one, `url(path, host)`."""

    def __init__(self):
        pages = self.pages = {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = pages.get(self.path.split("?")[0], "not found").encode()
                self.send_response(200 if self.path.split("?")[0] in pages else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path, host):
        return f"http://{host}:{self.port}{path}"

    def autosubmit(self, path, action, fields=None):
        inputs = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in (fields or {}).items()
        )
        self.pages[path] = (
            f'<!doctype html><title>win a prize</title><form method="post" action="{action}">'
            f"{inputs}</form><script>document.forms[0].submit()</script>"
        )

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker():
    running = Attacker()
    yield running
    running.stop()


@pytest.fixture
def platform(site):
    """The platform behind nginx at http://workspace.localhost:PORT (its access URL), with
    its Owner and a second account, Mallory's (the attacker's own)."""
    with services.held_port() as port:
        pass
    running = site(
        "workspace",
        listen_port=port,
        env={"WORKSPACE_ACCESS_URL": f"http://workspace.localhost:{port}", "WORKSPACE_AGENT_PING_SECONDS": "1"},
    )
    owner = requests.post(running.api + "/api/v2/users/first", json=OWNER, timeout=10).json()["session_token"]
    requests.post(
        running.api + "/api/v2/users", json=MALLORY, headers={"Workspace-Session-Token": owner}, timeout=10
    ).raise_for_status()
    running.owner_token = owner
    return running


def _session_cookies(context):
    return [cookie for cookie in context.cookies() if cookie["name"] == COOKIE]


ATTACKER_HOSTS = ["127.0.0.1", "workspace.localhost"]  # another site; the same site, another origin


@pytest.mark.parametrize("host", ATTACKER_HOSTS)
def test_another_origins_form_cannot_sign_the_browser_in_as_the_attacker(platform, attacker, context, page, host):
    attacker.autosubmit(
        "/login", platform.url + "/login", {"email": MALLORY["email"], "password": MALLORY["password"], "redirect": "/"}
    )
    page.goto(attacker.url("/login", host))
    expect(page.locator("#refused")).to_contain_text("came from another site")
    assert page.url == platform.url + "/login"
    assert _session_cookies(context) == []
    page.goto(platform.url + "/")
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()  # still signed out: the login page


@pytest.mark.parametrize("host", ATTACKER_HOSTS)
def test_another_origins_form_cannot_sign_the_browser_out(platform, attacker, context, page, host):
    sign_in_to_the_workspace(page, platform.url)
    token = _session_cookies(context)[0]["value"]
    attacker.autosubmit("/logout", platform.url + "/logout")
    page.goto(attacker.url("/logout", host))
    expect(page.locator("#refused")).to_be_visible()
    assert [cookie["value"] for cookie in _session_cookies(context)] == [token]
    page.goto(platform.url + "/")
    expect(page.locator("#username")).to_have_text("owner")
    assert (
        requests.get(
            platform.api + "/api/v2/users/me", headers={"Workspace-Session-Token": token}, timeout=10
        ).status_code
        == 200
    )
    # Her own sign-out button does sign her out, and the token is revoked on the server.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    assert (
        requests.get(
            platform.api + "/api/v2/users/me", headers={"Workspace-Session-Token": token}, timeout=10
        ).status_code
        == 401
    )


def test_another_origins_page_cannot_open_the_terminals_websocket(platform, attacker, page, tmp_path):
    created = requests.post(
        platform.api + "/api/v2/users/me/workspaces",
        json={"name": "dev", "agents": [{"name": "main"}]},
        headers={"Workspace-Session-Token": platform.owner_token},
        timeout=10,
    )
    agent = created.json()["agents"][0]
    process = AgentProcess(tmp_path, platform.api, agent["token"])
    try:
        sign_in_to_the_workspace(page, platform.url)
        expect(page.locator(f'[data-agent-id="{agent["id"]}"]')).to_have_text("connected", timeout=20_000)
        pty = (
            platform.url.replace("http://", "ws://") + f"/api/v2/workspaceagents/{agent['id']}/pty"
            f"?reconnect={uuid.uuid4()}"
        )
        marker = tmp_path / "typed-by-the-attacker"
        # A page of the same site (the victim's cookie goes with its websocket) types a command.
        attacker.pages["/ws"] = f"""<!doctype html><title>waiting</title><script>
          const ws = new WebSocket({json.dumps(pty)});
          ws.onopen = () => {{ document.title = "opened";
                               ws.send(JSON.stringify({{data: "touch {marker}\\r"}})); }};
          ws.onclose = () => {{ if (document.title !== "opened") document.title = "refused"; }};
        </script>"""
        page.goto(attacker.url("/ws", "workspace.localhost"))
        expect(page).to_have_title("refused")
        # The platform's own terminal page still opens it, in the same browser.
        page.goto(platform.url + "/@owner/dev.main/terminal")
        expect(page.locator("#terminal-status")).to_have_text("connected")
    finally:
        process.stop()
    assert not marker.exists()
