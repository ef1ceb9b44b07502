"""The workspaces API: create, list, get, delete; validation; who sees what."""

import requests

from tests.support.workspace import create_workspace

OTHER = {"email": "bo@example.com", "username": "bo", "password": "second good passphrase"}


def _other_user(ws, owner):
    requests.post(ws.api + "/users", json=OTHER, headers=ws.as_user(owner), timeout=10)
    return ws.login(OTHER["email"], OTHER["password"]).json()["session_token"]


def test_create_returns_each_token_once_and_stores_only_a_hash(owned):
    ws, owner = owned
    created = create_workspace(
        ws,
        owner,
        "api-one",
        [
            {"name": "main"},
            {
                "name": "gpu",
                "apps": [
                    {
                        "slug": "code",
                        "display_name": "VS Code",
                        "url": "http://127.0.0.1:8080",
                        "sharing_level": "authenticated",
                    }
                ],
            },
        ],
    )
    assert [agent["name"] for agent in created["agents"]] == ["gpu", "main"]
    gpu = created["agents"][0]
    assert gpu["status"] == "connecting" and gpu["token"]
    assert gpu["apps"] == [
        {
            "slug": "code",
            "display_name": "VS Code",
            "url": "http://127.0.0.1:8080",
            "sharing_level": "authenticated",
            "path": "/@owner/api-one.gpu/apps/code/",
            "host_url": None,
        }
    ]  # no app hosts without WORKSPACE_WILDCARD_ACCESS_URL
    with ws.db() as db:
        query = "select token_hash from workspaceagent where id = ?"
        stored = (
            db.execute(query, (gpu["id"].replace("-", ""),)).fetchone() or db.execute(query, (gpu["id"],)).fetchone()
        )
    assert stored and gpu["token"][11:] not in stored[0]
    again = requests.get(f"{ws.api}/workspaces/{created['id']}", headers=ws.as_user(owner), timeout=10).json()
    assert "token" not in again["agents"][0]
    listed = requests.get(f"{ws.api}/users/owner/workspaces", headers=ws.as_user(owner), timeout=10).json()
    assert "api-one" in [w["name"] for w in listed]


def test_bad_input_is_400_and_changes_nothing(owned):
    ws, owner = owned
    before = ws.count("workspace")
    for body, field in [
        ({"name": "Bad Name", "agents": [{"name": "main"}]}, "name"),
        ({"name": "ok", "agents": []}, "agents"),
        ({"name": "ok", "agents": [{"name": "a"}, {"name": "a"}]}, "agents"),
        (
            {"name": "ok", "agents": [{"name": "main", "apps": [{"slug": "x", "url": "ftp://h"}]}]},
            "agents.0.apps.0.url",
        ),
        (
            {
                "name": "ok",
                "agents": [{"name": "main", "apps": [{"slug": "x", "url": "http://h:1", "sharing_level": "public"}]}],
            },
            "agents.0.apps.0.sharing_level",
        ),
        ({"name": "ok", "agents": [{"name": "main"}], "extra": 1}, "extra"),
    ]:
        response = requests.post(f"{ws.api}/users/me/workspaces", json=body, headers=ws.as_user(owner), timeout=10)
        assert response.status_code == 400, (body, response.text)
        problem = response.json()
        assert field in problem.get("detail", "") + problem["message"], (field, response.text)
    assert ws.count("workspace") == before


def test_duplicate_name_is_409(owned):
    ws, owner = owned
    create_workspace(ws, owner, "twice", [{"name": "main"}])
    response = requests.post(
        f"{ws.api}/users/me/workspaces",
        json={"name": "twice", "agents": [{"name": "main"}]},
        headers=ws.as_user(owner),
        timeout=10,
    )
    assert response.status_code == 409 and "twice" in response.json()["message"]


def test_someone_elses_workspace_is_404_but_an_admin_sees_it(owned):
    ws, owner = owned
    other = _other_user(ws, owner)
    mine = create_workspace(ws, owner, "private", [{"name": "main"}])
    for path in (f"/workspaces/{mine['id']}", f"/workspaceagents/{mine['agents'][0]['id']}", "/users/owner/workspaces"):
        response = requests.get(ws.api + path, headers=ws.as_user(other), timeout=10)
        assert response.status_code == 404, path
    assert (
        requests.delete(f"{ws.api}/workspaces/{mine['id']}", headers=ws.as_user(other), timeout=10).status_code == 404
    )
    assert (
        requests.post(
            f"{ws.api}/workspaceagents/{mine['agents'][0]['id']}/token", headers=ws.as_user(other), timeout=10
        ).status_code
        == 404
    )
    theirs = create_workspace(ws, other, "theirs", [{"name": "main"}])
    seen = requests.get(f"{ws.api}/workspaces/{theirs['id']}", headers=ws.as_user(owner), timeout=10)
    assert seen.status_code == 200 and seen.json()["owner_name"] == "bo"  # the Owner is an administrator
    assert [
        w["name"] for w in requests.get(f"{ws.api}/users/bo/workspaces", headers=ws.as_user(owner), timeout=10).json()
    ] == ["theirs"]
    assert requests.get(f"{ws.api}/workspaces/not-a-uuid", headers=ws.as_user(owner), timeout=10).status_code == 404


def test_delete_removes_the_workspace_and_its_agents(owned):
    ws, owner = owned
    created = create_workspace(ws, owner, "gone", [{"name": "main"}])
    response = requests.delete(f"{ws.api}/workspaces/{created['id']}", headers=ws.as_user(owner), timeout=10)
    assert response.status_code == 204
    assert (
        requests.get(f"{ws.api}/workspaces/{created['id']}", headers=ws.as_user(owner), timeout=10).status_code == 404
    )
    rpc = requests.get(
        f"{ws.api}/workspaceagents/me/rpc",
        headers={"Workspace-Session-Token": created["agents"][0]["token"]},
        timeout=10,
    )
    assert rpc.status_code == 401 and rpc.json()["detail"] == "the agent token is not valid"


def test_the_rpc_answers_plain_requests_without_an_upgrade(owned):
    ws, owner = owned
    created = create_workspace(ws, owner, "plain", [{"name": "main"}])
    missing = requests.get(f"{ws.api}/workspaceagents/me/rpc", timeout=10, allow_redirects=False)
    assert missing.status_code == 401 and missing.json()["detail"] == "no agent token was given"
    session_token = requests.get(f"{ws.api}/workspaceagents/me/rpc", headers=ws.as_user(owner), timeout=10)
    assert session_token.status_code == 401  # a session token is not an agent token
    plain = requests.get(
        f"{ws.api}/workspaceagents/me/rpc",
        timeout=10,
        headers={"Workspace-Session-Token": created["agents"][0]["token"]},
    )
    assert plain.status_code == 400 and "websocket" in plain.json()["message"]


def test_a_stopping_worker_sends_a_get_for_an_agent_it_no_longer_holds_to_the_next_workers(owned, monkeypatch):
    """A restart: the stopping worker closed its agents' connections; a GET it still
    answers goes again, on a new connection, to the next workers (slow, not failed)."""
    from app.workspace.tunnel import agents

    ws, owner = owned
    create_workspace(ws, owner, "stops", [{"name": "main", "apps": [{"slug": "code", "url": "http://127.0.0.1:9"}]}])
    app = f"{ws.url}/@owner/stops.main/apps/code/page?x=1"
    monkeypatch.setattr(agents, "stopping", True)
    again = requests.get(app, headers=ws.as_user(owner), timeout=30, allow_redirects=False)
    assert again.status_code == 307 and again.headers["Location"].endswith("/@owner/stops.main/apps/code/page?x=1")
    assert again.headers["Retry-After"] == "1"
    posted = requests.post(app, data=b"body", headers=ws.as_user(owner), timeout=30, allow_redirects=False)
    assert posted.status_code == 502  # a body is never sent twice
    monkeypatch.setattr(agents, "stopping", False)
    running = requests.get(app, headers=ws.as_user(owner), timeout=30, allow_redirects=False)
    assert running.status_code == 502 and running.json()["message"] == "The workspace agent is not connected."
