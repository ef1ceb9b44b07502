"""The workspace dashboard and web terminal in a real browser, through nginx, with a
real agent process: the agent's status changes on the dashboard as it connects and
goes away, and the terminal page runs a command in the workspace's shell and shows
its output (xterm.js served from the bundle's own files)."""

import requests
from playwright.sync_api import expect

from devtools import services
from tests.support.browser import WORKSPACE_OWNER, sign_in_to_the_workspace
from tests.support.workspace import AgentProcess

OWNER = WORKSPACE_OWNER


def _platform_with_workspace(site):
    # The terminal's websocket must come from WORKSPACE_ACCESS_URL's origin (Chromium
    # sends no Sec-Fetch-Site on websockets): the address the browser uses.
    with services.held_port() as port:
        pass
    running = site(
        "workspace",
        listen_port=port,
        env={"WORKSPACE_AGENT_PING_SECONDS": "1", "WORKSPACE_ACCESS_URL": f"http://workspace.localhost:{port}"},
    )
    token = requests.post(running.api + "/api/v2/users/first", json=OWNER, timeout=10).json()["session_token"]
    created = requests.post(
        running.api + "/api/v2/users/me/workspaces",
        json={"name": "dev", "agents": [{"name": "main"}]},
        headers={"Workspace-Session-Token": token},
        timeout=10,
    )
    assert created.status_code == 201, created.text
    return running, created.json()["agents"][0]


def test_the_dashboard_follows_the_agent_and_the_terminal_runs_a_command(site, page, tmp_path):
    running, agent = _platform_with_workspace(site)
    sign_in_to_the_workspace(page, running.url)
    badge = page.locator(f'[data-agent-id="{agent["id"]}"]')
    expect(badge).to_have_text("connecting")

    process = AgentProcess(tmp_path, running.api, agent["token"])
    try:
        expect(badge).to_have_text("connected", timeout=20_000)  # live, without a reload

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
