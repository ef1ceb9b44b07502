"""The prompt wizard's forward authentication through LemonLDAP::NG's own nginx handler:
the wizard's site asks it over FastCGI (`wizard_auth_fastcgi_pass`, the same
llng-fastcgi-server process that runs the portal: no new service), and the headers the
handler exports for the wizard's host (`Remote-User: $uid`, `Remote-Groups: $groups`)
are what the wizard reads. A visitor without a portal session is `public`."""

import pytest
import requests

from devtools import nginx
from devtools.lemonldap import LemonLdap, portal_session

FORGED = {"Remote-User": "root", "Remote-Groups": "admins", "X-Wiz-Test-User": "root", "X-Wiz-Test-Groups": "admins"}


@pytest.fixture(scope="module")
def wizard_backend(start_module_service):
    # The test identity is on: it must still be unusable through the proxy.
    return start_module_service("wizard", env={"WIZ_ALLOW_TEST_IDENTITY": "1"})


@pytest.fixture(scope="module")
def portal():
    with LemonLdap(protected_hosts=[nginx.default_host("wizard")]) as idp:
        yield idp


@pytest.fixture(scope="module")
def proxy(wizard_backend, portal, tmp_path_factory):
    running = nginx.start(
        tmp_path_factory.mktemp("nginx-wizard-llng"),
        upstreams={"wizard": f"127.0.0.1:{wizard_backend.port}"},
        variables={"wizard_auth_fastcgi_pass": f"unix:{portal.handler_socket}"},
    )
    yield running
    running.stop()


def me(proxy, **headers):
    response = requests.get(proxy.url + "/api/me", headers=proxy.headers("wizard", **headers), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def signed_in(portal, user):
    return {"Cookie": f"lemonldap={portal_session(portal.issuer, user)}"}


def test_visitors_without_a_portal_session_are_public(proxy):
    assert me(proxy) == {"id": "public", "username": "public", "is_admin": False}
    assert me(proxy, **FORGED)["id"] == "public"
    assert me(proxy, Cookie="lemonldap=" + "0" * 64)["id"] == "public"


def test_signed_in_visitors_carry_their_user_and_groups(proxy, portal):
    doctor = signed_in(portal, "dwho")  # groups timelords; users; wiz-admins
    assert me(proxy, **doctor) == {"id": "dwho", "username": "dwho", "is_admin": True}
    assert me(proxy, **doctor, **{"Remote-User": "root", "Remote-Groups": ""})["id"] == "dwho"
    rose = signed_in(portal, "rtyler")  # earthlings; users
    assert me(proxy, **rose, **{"Remote-Groups": "admins"}) == {"id": "rtyler", "username": "rtyler", "is_admin": False}


def test_a_write_lands_in_the_signed_in_users_library(proxy, portal):
    rose = signed_in(portal, "rtyler")
    saved = requests.post(
        proxy.url + "/api/collections/saved_prompts",
        timeout=10,
        headers=proxy.headers("wizard", **rose),
        json={"text": "through the handler"},
    )
    assert saved.status_code in (200, 201), saved.text
    mine = requests.get(
        proxy.url + "/api/collections/saved_prompts", headers=proxy.headers("wizard", **rose), timeout=10
    ).json()
    public = requests.get(
        proxy.url + "/api/collections/saved_prompts", headers=proxy.headers("wizard"), timeout=10
    ).json()
    assert "through the handler" in str(mine) and "through the handler" not in str(public)


def test_after_logging_out_at_the_portal_the_visitor_is_public(proxy, portal):
    session = portal_session(portal.issuer, "dwho")
    assert me(proxy, Cookie=f"lemonldap={session}")["id"] == "dwho"
    out = requests.get(portal.issuer + "/?logout=1", cookies={"lemonldap": session}, timeout=10)
    assert out.status_code == 200
    assert me(proxy, Cookie=f"lemonldap={session}")["id"] == "public"


def test_an_unreachable_handler_fails_closed(wizard_backend, tmp_path_factory):
    # Never `public` meanwhile: a signed-in user's writes would land in the shared library.
    folder = tmp_path_factory.mktemp("nginx-wizard-llng-down")
    down = nginx.start(
        folder,
        upstreams={"wizard": f"127.0.0.1:{wizard_backend.port}"},
        variables={"wizard_auth_fastcgi_pass": f"unix:{folder}/no-handler.sock"},
    )
    try:
        response = requests.get(down.url + "/api/me", headers=down.headers("wizard"), timeout=10)
        assert response.status_code == 500
    finally:
        down.stop()
