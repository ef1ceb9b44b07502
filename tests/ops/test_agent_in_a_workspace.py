"""An agent put in a workspace the way a user does it: a bare Debian root (python3
and curl only, devtools/bare_root.py) runs the one-line init against a platform
behind nginx, and then everything a user does with an agent works."""

import json
import os
import signal
import sys
import time
import uuid

import pytest
import requests
from simple_websocket import Client

from devtools import bare_root
from devtools import nginx as nginx_tool
from devtools.services import free_port
from devtools.waiting import wait_for
from tests.support.workspace import AGENT_ENV, TOKEN_HEADER, Workspace, create_workspace, wait_status

pytestmark = pytest.mark.slow

# The site is named by the address (the workspace shares this machine's network): plain URLs reach it.
HOST = "127.0.0.1"
PAGE = "hello from inside the workspace\n"


# Debian 12 (python3 3.11) and Debian 11 (3.9, the oldest the agent supports).
@pytest.fixture(scope="module", params=["bookworm", "bullseye"])
def root(request):
    reason = bare_root.unavailable()
    if reason:
        pytest.skip(f"!!! WORKSPACE ROOT NOT RUN: {reason} !!!")
    return bare_root.ensure_bare_root(log=lambda line: print(line, file=sys.stderr), suite=request.param)


def _terminal_says(base, owner, agent_id, command, expected):
    terminal = Client.connect(
        base.replace("http://", "ws://") + f"/api/v2/workspaceagents/{agent_id}/pty?reconnect={uuid.uuid4()}",
        headers={TOKEN_HEADER: owner},
    )
    try:
        terminal.send(json.dumps({"data": command + "\r"}))
        seen = b""
        while expected not in seen:
            seen += terminal.receive(timeout=30) or b""
    finally:
        terminal.close()


def test_the_one_line_init_in_a_bare_debian_root(root, start_service, tmp_path_factory):
    port, app_port = free_port(), free_port()
    access = f"http://{HOST}:{port}"
    ws = Workspace(start_service("workspace", env={**AGENT_ENV, "WORKSPACE_ACCESS_URL": access}))
    proxy = nginx_tool.start(
        tmp_path_factory.mktemp("nginx-workspace"),
        port,
        upstreams={"workspace": f"127.0.0.1:{ws.service.port}"},
        hosts={"workspace": HOST},
    )
    try:
        owner = ws.first_user()
        agent = create_workspace(
            ws, owner, "dev", [{"name": "main", "apps": [{"slug": "site", "url": f"http://127.0.0.1:{app_port}"}]}]
        )["agents"][0]
        # The workspace's own app (python3's http.server), then the one line a template runs.
        command = (
            f"mkdir -p /root/site && printf '{PAGE}' > /root/site/index.html && "
            f"(python3 -m http.server {app_port} --bind 127.0.0.1 --directory /root/site "
            f">/root/site.log 2>&1 &) && "
            f'curl -fsS -X POST -H "{TOKEN_HEADER}: $SESSION" '
            f"{access}/api/v2/workspaceagents/{agent['id']}/init-script | sh"
        )
        log_path = tmp_path_factory.mktemp("workspace") / "workspace.log"
        with bare_root.Workspace.start(
            root, ["/bin/sh", "-c", command], env={"SESSION": owner}, log_path=log_path
        ) as workspace:
            try:
                _everything_works(ws, proxy, owner, agent, workspace, access)
            except BaseException:
                print(workspace.log(), file=sys.stderr)
                raise
    finally:
        proxy.stop()


def _everything_works(ws, proxy, owner, agent, workspace, access):
    wait_status(ws, owner, agent["id"], "connected", timeout=60)
    headers = {TOKEN_HEADER: owner}
    app_url = f"{proxy.url}/@owner/dev.main/apps/site/"
    wait_for(lambda: requests.get(app_url, headers=headers, timeout=10).text == PAGE, "the app through the proxy")

    _terminal_says(proxy.url, owner, agent["id"], "echo in-$((6*7))-$(cat /etc/hostname)", b"in-42-workspace")

    # A relay client on Debian's python3 alone, inside the workspace, with the file the init script fetched.
    relay = workspace.run(
        [
            "env",
            f"WORKSPACE_SESSION_TOKEN={owner}",
            "python3",
            "-I",
            "/root/.cache/workspace-agent/workspace-agent.pyz",
            "relay",
            "--url",
            access,
            "--agent",
            agent["id"],
            "app",
            "site",
            "/",
        ]
    )
    assert relay.returncode == 0 and relay.stdout == PAGE, relay.stderr

    [first] = workspace.processes("workspace-agent.pyz agent")
    killed = time.monotonic()
    os.kill(first, signal.SIGKILL)
    wait_for(
        lambda: [pid for pid in workspace.processes("workspace-agent.pyz agent") if pid != first],
        "the init script starting the agent again",
        timeout=60,
    )
    wait_for(lambda: "starting it again" in workspace.log(), "the init script's word")
    wait_for(
        lambda: requests.get(app_url, headers=headers, timeout=10).text == PAGE, "the app after the kill", timeout=60
    )
    print(f"the app answers again {time.monotonic() - killed:.1f} s after the agent was killed", file=sys.stderr)
    log = workspace.log()
    assert owner not in log and "WORKSPACE_AGENT_TOKEN='" not in log
