"""A hostile workspace app in a real browser (Chromium, through nginx, real agents):
Mallory's app, shared with every signed-in user, is opened by the Owner (an
administrator, signed in on the platform). Its page's script tries to read her account,
to create a workspace in her name, to open her terminal's websocket and type into it,
and to replace her session cookie (by its answer's Set-Cookie and by document.cookie).

On its own host (WORKSPACE_WILDCARD_ACCESS_URL) the platform's cookie never goes with
those requests: the platform answers each of them 401, as to a stranger (its request
log says so, whatever the browser lets the script see). On its path, shared through
WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING, the answer's CSP sandbox gives the script an
opaque origin, with the same result. Either way her cookie is as it was and she is still
herself on the dashboard. (The websocket's own Origin check, added elsewhere, is not
what these tests rely on: the 401s show that no cookie came with the handshake.)"""

import json
import subprocess
import time

import pytest
import requests
from playwright.sync_api import expect

from devtools import nginx, services
from tests.support.browser import WORKSPACE_OWNER, sign_in_to_the_workspace
from tests.support.proxy import ATTACKER_TOKEN, HostileApp, ServiceLog
from tests.support.workspace import AGENT_ENV, AgentProcess, Workspace, wait_status

OWNER = WORKSPACE_OWNER
MALLORY = {"email": "mallory@example.com", "username": "mallory", "password": "quiet-river-stone-4242"}
PLATFORM = "workspace.localhost"

# The attacks, in the app's page; what each got is written to #out as JSON.
SCRIPT = """
const platform = "http://%(platform)s";
const out = {};
async function attempt(name, run) {
  try { out[name] = await run(); } catch (error) { out[name] = "refused: " + error; }
}
(async () => {
  await attempt("account", async () => {
    const answer = await fetch(platform + "/api/v2/users/me", {credentials: "include"});
    return answer.status + " " + await answer.text();
  });
  await attempt("workspace", async () => {
    const answer = await fetch(platform + "/api/v2/users/me/workspaces", {
      method: "POST", credentials: "include", mode: "no-cors", headers: {"Content-Type": "text/plain"},
      body: JSON.stringify({name: "planted", agents: [{name: "main"}]})});
    return "sent " + answer.type;
  });
  await attempt("terminal", () => new Promise(resolve => {
    const socket = new WebSocket(platform.replace("http", "ws") +
      "/api/v2/workspaceagents/%(agent)s/pty?reconnect=6f1c3a52-2a4b-4a55-9b38-6a3a2f0d9e11");
    socket.onopen = () => socket.send(JSON.stringify({data: "echo typed-by-the-app\\n"}));
    socket.onmessage = () => resolve("opened, and the shell answered");
    socket.onclose = event => resolve("closed " + event.code);
  }));
  await attempt("document.cookie", async () => {
    document.cookie = "workspace_session_token=%(attacker)s; path=/";
    document.cookie = "workspace_session_token=%(attacker)s; path=/; domain=localhost";
    return "set";
  });
  await attempt("set-cookie", async () => (await fetch("cookies")).status);
  out.done = true;
  document.getElementById("out").textContent = JSON.stringify(out);
})();
"""


@pytest.fixture
def platform(tmp_path, tmp_path_factory):
    """start(env, wildcard) -> a namespace: the platform behind nginx at
    http://workspace.localhost:PORT (and *.apps.localhost:PORT if `wildcard`), the Owner
    with a workspace `dev` whose agent runs, Mallory with `evil` serving the hostile app
    (shared with signed-in users) through her agent, the platform's log."""
    started = []

    def start(env, wildcard):
        with services.held_port() as port:
            access = f"http://{PLATFORM}:{port}"
            env = {**AGENT_ENV, "WORKSPACE_ACCESS_URL": access, **env}
            if wildcard:
                env["WORKSPACE_WILDCARD_ACCESS_URL"] = f"*.apps.localhost:{port}"
            log_path = tmp_path / f"platform-{port}.log"
            with open(log_path, "wb") as log:
                service = services.start(
                    "workspace", tmp_path_factory.mktemp("platform"), env=env, stdout=log, stderr=subprocess.STDOUT
                )
            started.append(service)
        proxy = nginx.start(
            tmp_path_factory.mktemp("nginx"),
            port,
            upstreams={"workspace": f"127.0.0.1:{service.port}"},
            hosts={"workspace": PLATFORM},
            variables={"workspace_apps_host": "*.apps.localhost"} if wildcard else {},
        )
        started.append(proxy)
        api = service.base_url + "/api/v2"
        owner = requests.post(api + "/users/first", json=OWNER, timeout=10).json()["session_token"]
        requests.post(
            api + "/users", json=MALLORY, headers={"Workspace-Session-Token": owner}, timeout=10
        ).raise_for_status()
        mallory = requests.post(
            api + "/users/login", json={"email": MALLORY["email"], "password": MALLORY["password"]}, timeout=10
        ).json()["session_token"]
        victim_agent = _workspace(api, owner, "dev", [])
        hostile = HostileApp(
            SCRIPT % {"platform": f"{PLATFORM}:{port}", "agent": victim_agent["id"], "attacker": ATTACKER_TOKEN}
        )
        started.append(hostile)
        evil_agent = _workspace(
            api, mallory, "evil", [{"slug": "hostile", "url": hostile.url, "sharing_level": "authenticated"}]
        )
        for agent, token in ((victim_agent, owner), (evil_agent, mallory)):
            started.append(AgentProcess(tmp_path, service.base_url, agent["token"]))
            wait_status(Workspace(service), token, agent["id"], "connected")
        return type(
            "Platform", (), {"url": access, "port": port, "api": api, "log": ServiceLog(log_path), "owner": owner}
        )

    yield start
    for item in reversed(started):
        item.stop()


def _workspace(api, token, name, apps):
    created = requests.post(
        api + "/users/me/workspaces",
        json={"name": name, "agents": [{"name": "main", "apps": apps}]},
        headers={"Workspace-Session-Token": token},
        timeout=10,
    )
    assert created.status_code == 201, created.text
    return created.json()["agents"][0]


def _answered(running, mark, fragment, timeout=10.0):
    """The first request line past the `mark`-th that holds `fragment` (polled with a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in running.log.request_lines()[mark:] if fragment in line]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {fragment!r} in the platform's log:\n{running.log.text()}"
        time.sleep(0.05)  # polling the log file with a deadline


def _attacks_failed(page, running, context, mark):
    """The page's script ran every attack; the platform answered each (past the `mark`-th
    request line) as to a stranger, and the Owner's cookie and identity are as they were."""
    expect(page.locator("#out")).to_contain_text('"done":true', timeout=20_000)
    seen = json.loads(page.locator("#out").text_content())
    assert not seen["account"].startswith("200"), seen
    assert seen["terminal"] != "opened, and the shell answered", seen
    # What the platform answered (the script sees little of it): no cookie came along.
    for fragment in ("GET /api/v2/users/me ", "POST /api/v2/users/me/workspaces ", "/pty "):
        assert " 401 " in _answered(running, mark, fragment), fragment
    cookies = [c for c in context.cookies(running.url) if c["name"] == "workspace_session_token"]
    assert [c["value"] for c in cookies] == [cookies[0]["value"]] and cookies[0]["value"] != ATTACKER_TOKEN
    assert cookies[0]["domain"] == PLATFORM
    mine = requests.get(
        running.api + "/users/me/workspaces", headers={"Workspace-Session-Token": running.owner}, timeout=10
    ).json()
    assert "planted" not in json.dumps(mine)
    dashboard = page.context.new_page()
    dashboard.goto(running.url + "/")
    expect(dashboard.locator("#username")).to_have_text("owner")


def test_an_app_on_its_own_host_cannot_act_as_its_visitor(platform, page, context):
    running = platform({}, wildcard=True)
    sign_in_to_the_workspace(page, running.url)
    app_url = f"http://hostile--main--evil--mallory.apps.localhost:{running.port}"
    mark = len(running.log.request_lines())
    page.goto(app_url + "/page")  # the handshake: to the platform and back, with a ticket
    assert page.url == app_url + "/page"
    _attacks_failed(page, running, context, mark)


def test_a_shared_path_app_runs_in_a_sandbox(platform, page, context):
    running = platform({"WORKSPACE_DANGEROUS_ALLOW_PATH_APP_SHARING": "true"}, wildcard=False)
    sign_in_to_the_workspace(page, running.url)
    mark = len(running.log.request_lines())
    answer = page.goto(running.url + "/@mallory/evil.main/apps/hostile/page")
    assert answer.headers["content-security-policy"].startswith("sandbox allow-scripts")
    _attacks_failed(page, running, context, mark)
