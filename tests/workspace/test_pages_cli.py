"""The workspace platform's pages and host-side commands, on a platform under gunicorn
and in processes of their own. Its redirect rule alone is tests/unit/workspace/test_pages_cli.py."""

import requests

from tests.support.workspace import OWNER, run_cli


def test_setup_then_login_page_then_dashboard(workspace):
    ws = workspace()
    browser = requests.Session()
    assert browser.get(ws.url + "/", allow_redirects=False, timeout=10).headers["Location"] == "/setup"
    weak = browser.post(ws.url + "/setup", data={**OWNER, "password": "short"}, allow_redirects=False, timeout=10)
    assert weak.status_code == 400 and "password: must be at least 8 characters" in weak.text
    created = browser.post(ws.url + "/setup", data=OWNER, allow_redirects=False, timeout=30)
    assert created.status_code == 303 and created.headers["Location"] == "/"
    dashboard = browser.get(ws.url + "/", timeout=10)
    assert dashboard.status_code == 200 and '<dd id="username">owner</dd>' in dashboard.text
    assert browser.get(ws.url + "/setup", allow_redirects=False, timeout=10).headers["Location"] == "/login"

    stranger = requests.Session()
    page = stranger.get(ws.url + "/login?redirect=//evil.example", timeout=10)
    assert page.status_code == 200 and 'name="password"' in page.text and 'value="/"' in page.text
    assert "sso" not in page.text  # OIDC is not configured
    bad = stranger.post(ws.url + "/login", data={"email": OWNER["email"], "password": "nope nope"}, timeout=30)
    assert bad.status_code == 401 and "Incorrect email or password." in bad.text
    good = stranger.post(
        ws.url + "/login",
        data={"email": OWNER["email"], "password": OWNER["password"], "redirect": "/settings"},
        allow_redirects=False,
        timeout=30,
    )
    assert good.status_code == 303 and good.headers["Location"] == "/settings"
    assert stranger.get(ws.api + "/users/me", timeout=10).json()["username"] == "owner"
    out = stranger.post(ws.url + "/logout", allow_redirects=False, timeout=10)
    assert out.headers["Location"] == "/login"
    assert stranger.get(ws.api + "/users/me", timeout=10).status_code == 401


def test_reset_password_on_the_host_revokes_sessions(workspace):
    ws = workspace()
    token = ws.first_user()
    weak = run_cli(ws, "reset-password", "owner", stdin="123\n")
    assert weak.returncode == 1 and "must be at least 8 characters" in weak.stderr
    missing = run_cli(ws, "reset-password", "nobody", stdin="a long passphrase\n")
    assert missing.returncode == 1 and "no user 'nobody'" in missing.stderr
    done = run_cli(ws, "reset-password", "OWNER", stdin="a brand new passphrase\n")
    assert done.returncode == 0, done.stderr
    assert requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10).status_code == 401
    assert ws.login(OWNER["email"], OWNER["password"]).status_code == 401
    assert ws.login(OWNER["email"], "a brand new passphrase").status_code == 201
    with ws.db() as db:
        assert db.execute("select count(*) from auditlog where action = 'user.password_reset'").fetchone()[0] == 1


def test_create_admin_works_without_a_running_server(tmp_path):
    class Stopped:
        class service:
            data_dir = tmp_path

    first = run_cli(
        Stopped, "create-admin", "--username", "root", "--email", "root@example.com", stdin="correct horse battery\n"
    )
    assert first.returncode == 0, first.stderr
    second = run_cli(
        Stopped, "create-admin", "--username", "ROOT", "--email", "r2@example.com", stdin="correct horse battery\n"
    )
    assert second.returncode == 1 and "already exists" in second.stderr
    import sqlite3

    with sqlite3.connect(tmp_path / "workspace.db") as db:
        assert db.execute("select username, roles from user").fetchall() == [("root", '["owner"]')]
        assert db.execute("select count(*) from singleton").fetchone()[0] == 1  # it was the first user


def test_create_owner_claims_the_platform_once_and_then_says_it_has_one(workspace):
    ws = workspace()
    args = ("create-owner", "--username", "root", "--email", "root@example.com", "--name", "Root")
    weak = run_cli(ws, *args, stdin="short\n")
    assert weak.returncode == 1 and "password: must be at least 8 characters" in weak.stderr
    bad = run_cli(ws, "create-owner", "--username", "root", "--email", "not-an-email", stdin="correct horse battery\n")
    assert bad.returncode == 1 and "email" in bad.stderr
    assert requests.get(ws.api + "/users/first", timeout=10).status_code == 404  # still unclaimed
    first = run_cli(ws, *args, stdin="correct horse battery\n")
    assert first.returncode == 0 and "Created the Owner root" in first.stdout, first.stderr
    me = ws.login("root@example.com", "correct horse battery")
    assert me.status_code == 201
    user = requests.get(ws.api + "/users/me", headers=ws.as_user(me.json()["session_token"]), timeout=10).json()
    assert user["roles"] == ["owner"] and user["name"] == "Root"
    # The playbook runs it on every provisioning: no password is read, nothing changes.
    again = run_cli(ws, "create-owner", "--username", "other", "--email", "other@example.com", stdin="")
    assert again.returncode == 0 and again.stdout == "the platform already has its Owner\n", again.stderr
    # And nobody can claim it through the set-up page or the API any more.
    assert requests.post(ws.api + "/users/first", json=OWNER, timeout=30).status_code == 409
    setup = requests.post(ws.url + "/setup", data=OWNER, allow_redirects=False, timeout=30)
    assert setup.headers["Location"] == "/login"
    with ws.db() as db:
        assert db.execute("select count(*) from user").fetchone()[0] == 1
