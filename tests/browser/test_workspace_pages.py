"""The workspace platform's sign-in pages in a real browser, through nginx: the login
page with its password form and single-sign-on button, a password sign-in that lands
on the dashboard, and a sign-in through the (Authelia-shaped) identity provider."""

import secrets

import pytest
import requests
from playwright.sync_api import expect

from devtools import services
from devtools.oidc_provider import OidcProvider, pbkdf2_sha512_digest

SIGN_IN_TEXT = "Sign in with Example SSO"
OWNER = {"email": "owner@example.com", "username": "owner", "password": "Tr1cky-horse-battery"}
IDP_PASSWORD = "idp-pass-9ZqW"


@pytest.fixture
def platform(site):
    """The platform behind nginx at http://workspace.localhost:PORT, with OIDC against a
    local provider whose one redirect URI is that address's callback; the Owner exists."""
    secret = secrets.token_urlsafe(32)
    with services.held_port() as port:  # until the provider has a port of its own
        access_url = f"http://workspace.localhost:{port}"
        idp = OidcProvider(
            {
                "clients": [
                    {
                        "client_id": "workspace",
                        "client_name": "Workspace",
                        "client_secret_digest": pbkdf2_sha512_digest(secret, rounds=1000),
                        "redirect_uris": [access_url + "/api/v2/users/oidc/callback"],
                    }
                ],
                "users": [{"username": "dave", "password": IDP_PASSWORD, "email": "dave@example.net", "name": "Dave"}],
            }
        ).start()
    with idp:
        running = site(
            "workspace",
            listen_port=port,
            env={
                "WORKSPACE_ACCESS_URL": access_url,
                "WORKSPACE_OIDC_ISSUER_URL": idp.issuer,
                "WORKSPACE_OIDC_CLIENT_ID": "workspace",
                "WORKSPACE_OIDC_CLIENT_SECRET": secret,
                "WORKSPACE_OIDC_SIGN_IN_TEXT": SIGN_IN_TEXT,
            },
        )
        requests.post(running.api + "/api/v2/users/first", json=OWNER, timeout=10).raise_for_status()
        yield running


def test_the_login_page_shows_the_password_form_and_the_sso_button(platform, page):
    page.goto(platform.url + "/login")
    expect(page.get_by_label("Email")).to_be_visible()
    expect(page.get_by_label("Password")).to_be_visible()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    expect(page.locator("#sso")).to_have_text(SIGN_IN_TEXT)


def test_a_password_sign_in_lands_on_the_dashboard(platform, page):
    page.goto(platform.url + "/login")
    page.get_by_label("Email").fill(OWNER["email"])
    page.get_by_label("Password").fill(OWNER["password"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#username")).to_have_text("owner")
    assert page.url.rstrip("/") == platform.url


def test_a_wrong_password_says_so_on_the_login_page(platform, page):
    page.goto(platform.url + "/login")
    page.get_by_label("Email").fill(OWNER["email"])
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_be_visible()
    expect(page.locator("#username")).to_have_count(0)


def test_a_sign_in_through_the_identity_provider_lands_on_the_dashboard(platform, page):
    page.goto(platform.url + "/login")
    page.locator("#sso").click()
    # The provider's one-factor form (its own host), then straight back: consent is implicit.
    page.get_by_label("Username").fill("dave")
    page.get_by_label("Password").fill(IDP_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#username")).to_have_text("dave")
    assert page.url.startswith(platform.url)
