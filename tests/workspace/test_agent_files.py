"""The platform hands out its agent: the zipapp and its digest under /bin/, the init
script (public, the token from the environment; or minted with the owner's session),
and what buildinfo says of them. The whole chain in a bare Debian root is in
tests/proxy/test_agent_in_a_workspace.py."""

import hashlib
import io
import os
import subprocess
import zipfile

import pytest
import requests

from devtools.services import free_port
from tests.support.workspace import AGENT_ENV, SYSTEM_PYTHON, TOKEN_HEADER, Workspace, create_workspace, wait_status
from workspace_protocol.mux import VERSION as PROTOCOL_VERSION


@pytest.fixture(scope="module")
def platform(start_module_service):
    """A platform whose public address is its own (the init script points there)."""
    port = free_port()
    ws = Workspace(
        start_module_service(
            "workspace", port=port, env={**AGENT_ENV, "WORKSPACE_ACCESS_URL": f"http://127.0.0.1:{port}"}
        )
    )
    return ws, ws.first_user()


def test_buildinfo_names_the_agent_and_the_file_has_its_digest(platform):
    ws, _ = platform
    info = requests.get(ws.url + "/api/v2/buildinfo", timeout=10).json()
    agent = info["agent"]
    assert agent["version"] == info["version"] and agent["protocol_version"] == PROTOCOL_VERSION
    assert agent["url"] == ws.url + "/bin/workspace-agent.pyz"
    download = requests.get(agent["url"], timeout=10)
    assert download.status_code == 200 and download.headers["ETag"] == f'"{agent["sha256"]}"'
    assert hashlib.sha256(download.content).hexdigest() == agent["sha256"]
    digest = requests.get(agent["url"] + ".sha256", timeout=10)
    assert digest.text == f"{agent['sha256']}  workspace-agent.pyz\n"
    again = requests.get(agent["url"], headers={"If-None-Match": download.headers["ETag"]}, timeout=10)
    assert again.status_code == 304 and not again.content
    names = zipfile.ZipFile(io.BytesIO(download.content)).namelist()
    assert "__main__.py" in names and "workspace_agent/VERSION" in names
    assert {name.split("/")[0] for name in names} == {"__main__.py", "workspace_agent", "workspace_protocol"}


def test_the_agent_file_runs_on_the_standard_library_alone(platform, tmp_path):
    ws, _ = platform
    path = tmp_path / "workspace-agent.pyz"
    path.write_bytes(requests.get(ws.url + "/bin/workspace-agent.pyz", timeout=10).content)
    # -S: not even the system's site-packages (Debian's dist-packages).
    imports = subprocess.run(
        [
            SYSTEM_PYTHON,
            "-I",
            "-S",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "import workspace_agent.agent, workspace_agent.relay_client; "
            "print(workspace_agent.version())",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.strip() == requests.get(ws.url + "/api/v2/buildinfo", timeout=10).json()["version"]
    usage = subprocess.run([SYSTEM_PYTHON, "-I", "-S", str(path)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "agent,relay" in usage.stderr


def _run_script(script, tmp_path, env):
    """The init script on this machine with `sh`, its agent's file under tmp_path."""
    environment = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHELL": "/bin/sh", **env}
    log = open(tmp_path / "init.log", "wb")
    process = subprocess.Popen(
        ["sh", "-s", "--"],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environment,
        start_new_session=True,
    )
    process.stdin.write(script.encode())
    process.stdin.close()
    return process


def _stop(process):
    if process.poll() is None:
        process.terminate()  # the script's trap stops its agent too
        process.wait(20)


def test_the_public_init_script_takes_the_token_from_the_environment_and_replaces_a_stale_file(platform, tmp_path):
    ws, owner = platform
    agent = create_workspace(ws, owner, "public-init", [{"name": "main"}])["agents"][0]
    script = requests.get(ws.url + "/api/v2/init-script", timeout=10)
    assert script.status_code == 200 and script.headers["Content-Type"].startswith("text/x-shellscript")
    assert f"ACCESS_URL='{ws.url}'" in script.text and "WORKSPACE_AGENT_TOKEN='" not in script.text

    without = subprocess.run(
        ["sh", "-s"],
        input=script.text,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
    )
    assert without.returncode == 2 and "WORKSPACE_AGENT_TOKEN is not set" in without.stderr

    cached = tmp_path / ".cache/workspace-agent/workspace-agent.pyz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"an agent of another release")
    process = _run_script(script.text, tmp_path, {"WORKSPACE_AGENT_TOKEN": agent["token"]})
    try:
        wait_status(ws, owner, agent["id"], "connected")
    finally:
        _stop(process)
    log = (tmp_path / "init.log").read_text()
    assert "fetched the agent" in log and agent["token"] not in log
    digest = requests.get(ws.url + "/bin/workspace-agent.pyz.sha256", timeout=10).text.split()[0]
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == digest
    wait_status(ws, owner, agent["id"], "disconnected")  # the trap stopped the agent with the script


def test_a_minted_init_script_carries_a_new_token_and_needs_the_owner(platform, tmp_path):
    ws, owner = platform
    agent = create_workspace(ws, owner, "minted-init", [{"name": "main"}])["agents"][0]
    url = f"{ws.url}/api/v2/workspaceagents/{agent['id']}/init-script"
    assert requests.post(url, timeout=10).status_code == 401
    requests.post(
        ws.api + "/users",
        json={"email": "stranger@example.com", "username": "stranger", "password": "another good passphrase"},
        headers=ws.as_user(owner),
        timeout=10,
    ).raise_for_status()
    stranger = ws.login("stranger@example.com", "another good passphrase").json()["session_token"]
    assert requests.post(url, headers={TOKEN_HEADER: stranger}, timeout=10).status_code == 404
    minted = requests.post(url, headers={TOKEN_HEADER: owner}, timeout=10)
    assert minted.status_code == 200 and minted.headers["Cache-Control"] == "no-store"
    assert "WORKSPACE_AGENT_TOKEN='" in minted.text and agent["token"] not in minted.text
    refused = requests.get(
        ws.url + "/api/v2/workspaceagents/me/rpc", headers={TOKEN_HEADER: agent["token"]}, timeout=10
    )
    assert refused.status_code == 401  # minting replaced the token the workspace was created with
    process = _run_script(minted.text, tmp_path, {})
    try:
        wait_status(ws, owner, agent["id"], "connected")
    finally:
        _stop(process)


def test_the_agent_reaches_a_platform_named_under_localhost(platform, start_agent):
    """`make run` names its sites *.localhost; the agent dials such names on loopback
    (RFC 6761), as curl and browsers do, where the system's resolver would not."""
    ws, owner = platform
    agent = create_workspace(ws, owner, "local-name", [{"name": "main"}])["agents"][0]
    start_agent(f"http://workspace.localhost:{ws.service.port}", agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
