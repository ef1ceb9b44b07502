"""Identity from the proxy's trusted headers, and the loopback test identity."""

import requests

from tests.support.wizard import WizardClient


def test_every_api_route_needs_remote_user(wizard_server):
    for method, path in [
        ("GET", "/api/me"),
        ("GET", "/api/collections/wizards"),
        ("POST", "/api/likes/toggle"),
        ("GET", "/api/events"),
        ("POST", "/api/uploads"),
        ("POST", "/api/errors"),
        ("GET", "/api/nothing-here"),
    ]:
        response = requests.request(method, wizard_server.base_url + path, timeout=10)
        assert response.status_code == 401, (method, path)
        assert "Remote-User" in response.json()["error"]


def test_anonymous_is_the_shared_public_identity(wizard_server):
    public = WizardClient(wizard_server.base_url, "public", "admins", trusted=True)
    assert public.get("/api/me").json() == {"id": "public", "username": "public", "is_admin": False}


def test_groups_make_administrators_comma_pipe_or_semicolon_separated(wizard_server):
    client = WizardClient(wizard_server.base_url, trusted=True)
    assert client.as_user("ann", "users, admins").get("/api/me").json()["is_admin"] is True
    assert client.as_user("ann", "users|wiz-admins").get("/api/me").json()["is_admin"] is True
    assert client.as_user("ann", "timelords; wiz-admins").get("/api/me").json()["is_admin"] is True  # LemonLDAP::NG
    assert client.as_user("ann", "users,administrators").get("/api/me").json()["is_admin"] is False
    assert client.as_user("ann").get("/api/me").json() == {"id": "ann", "username": "ann", "is_admin": False}


def test_a_malformed_user_name_is_refused(wizard_server):
    response = requests.get(wizard_server.base_url + "/api/me", headers={"Remote-User": "a,b"}, timeout=10)
    assert response.status_code == 401


def test_test_identity_is_honoured_from_loopback_when_enabled(wizard):
    assert wizard.as_user("tess", "wiz-admins").get("/api/me").json() == {
        "id": "tess",
        "username": "tess",
        "is_admin": True,
    }


def test_test_identity_is_ignored_when_the_request_names_a_forwarder(wizard):
    for header in ("X-Forwarded-For", "X-Real-IP"):
        response = wizard.as_user("tess", "admins").get("/api/me", headers={header: "127.0.0.1"})
        assert response.status_code == 401, header
        response = wizard.as_user("tess", "admins").get(
            "/api/me", headers={header: "127.0.0.1", "Remote-User": "public"}
        )
        assert response.json()["id"] == "public"
