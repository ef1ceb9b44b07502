"""Workspace platform, checked through its public address (nginx in front).
Read-only: it never creates the first user of a deployment it is pointed at."""


def test_build_info_and_auth_methods(workspace):
    info = workspace.get("/api/v2/buildinfo")
    assert info.status_code == 200 and info.json()["version"] and info.json()["dashboard_url"]
    methods = workspace.get("/api/v2/users/authmethods").json()
    assert set(methods) == {"password", "oidc"} and "signInText" in methods["oidc"]


def test_first_user_state_is_answered(workspace):
    assert workspace.get("/api/v2/users/first").status_code in (200, 404)


def test_no_login_gate_for_machine_clients(workspace):
    """The proxy must not redirect clients without the identity provider's cookie."""
    for path in ("/api/v2/users/me", "/api/v2/workspaceagents/me/rpc"):
        response = workspace.get(path, allow_redirects=False, headers={"Workspace-Session-Token": "x"})
        assert response.status_code in (401, 404), (path, response.status_code)
        assert "Location" not in response.headers and "message" in response.json()


def test_login_page(workspace):
    page = workspace.get("/login")
    assert page.status_code == 200 and "Sign in" in page.text


def test_the_terminal_library_is_served_from_the_bundles_own_files(workspace):
    for name in ("xterm.js", "addon-fit.js", "xterm.css"):
        response = workspace.get(f"/static/vendor/xterm/{name}")
        assert response.status_code == 200 and len(response.content) > 1000, name
