"""The workspace dashboard and web terminal in a real browser, through nginx, with a
real agent process: the agent's status changes on the dashboard as it connects and
goes away, and the terminal page runs a command in the workspace's shell and shows
its output (xterm.js served from the bundle's own files)."""
import requests
from playwright.sync_api import expect

from tests.support.workspace import AgentProcess

OWNER = {"email": "owner@example.com", "username": "owner", "password": "Tr1cky-horse-battery"}


def _platform_with_workspace(site):
    running = site("workspace", env={"WORKSPACE_AGENT_PING_SECONDS": "1"})
    token = requests.post(running.api + "/api/v2/users/first", json=OWNER, timeout=10).json()["session_token"]
    created = requests.post(running.api + "/api/v2/users/me/workspaces",
                            json={"name": "dev", "agents": [{"name": "main"}]},
                            headers={"Workspace-Session-Token": token}, timeout=10)
    assert created.status_code == 201, created.text
    return running, created.json()["agents"][0]


def _sign_in(page, url):
    page.goto(url + "/login")
    page.get_by_label("Email").fill(OWNER["email"])
    page.get_by_label("Password").fill(OWNER["password"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#username")).to_have_text("owner")


def test_the_dashboard_follows_the_agent_and_the_terminal_runs_a_command(site, page, tmp_path):
    running, agent = _platform_with_workspace(site)
    _sign_in(page, running.url)
    badge = page.locator(f'[data-agent-id="{agent["id"]}"]')
    expect(badge).to_have_text("connecting")

    process = AgentProcess(tmp_path, running.api, agent["token"])
    try:
        expect(badge).to_have_text("connected", timeout=20_000)   # live, without a reload

        page.get_by_role("link", name="Terminal").click()
        expect(page.locator("#terminal-status")).to_have_text("connected")
        page.locator("#terminal").click()
        page.keyboard.type("echo browser-$((6*7))\n")
        expect(page.locator(".xterm-rows")).to_contain_text("browser-42")

        page.go_back()
        expect(badge).to_have_text("connected")
    finally:
        process.stop()
    expect(badge).to_have_text("disconnected", timeout=20_000)
