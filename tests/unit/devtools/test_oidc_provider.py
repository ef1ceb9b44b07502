"""The Authelia-shaped OIDC provider (devtools/oidc_provider.py), driven over HTTP with
requests as a browser and a client would drive it: discovery, the code flow with PKCE,
the id_token checked against the JWKS, userinfo, and every refusal the client
registration promises."""

import base64
import hashlib
import secrets
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import BadSignatureError
from joserfc.jwk import KeySet

from devtools.oidc_provider import (
    OidcProvider,
    parse_pbkdf2_sha512,
    pbkdf2_sha512_digest,
    sign_in,
    verify_pbkdf2_sha512,
)
from tests.support.oidc_provider_config import PASSWORD, REDIRECT_URI, SECRET, make_config

AUTHELIA_DIGEST = (
    "$pbkdf2-sha512$310000$c8p78n7pUMln0jzvd4aK4Q$JNRBzwAo0ek5qKn50cFzzvE9RXV88h1wJn5K"
    "GiHrD0YKtZaR/nCb2CJPOsKaPK0hjf.9yHxzQGZziziccp6Yng"
)


@pytest.fixture(scope="module")
def idp():
    with OidcProvider(make_config()) as provider:
        yield provider


@pytest.fixture(scope="module")
def metadata(idp):
    return requests.get(idp.discovery_url, timeout=10).json()


def pkce():
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def authorization_url(idp, challenge, **changes):
    """The request the workspace makes; a change to None drops that parameter."""
    params = {
        "client_id": "workspace",
        "redirect_uri": REDIRECT_URI,
        "response_type": "code",
        "scope": "openid profile email groups",
        "state": "state-0123456789",
        "nonce": secrets.token_urlsafe(16),
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    params.update(changes)
    return f"{idp.issuer}/api/oidc/authorization?" + urlencode({k: v for k, v in params.items() if v is not None})


def query_of(location):
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def new_code(idp, **changes):
    """Sign alice in with a fresh browser session; returns (code, verifier)."""
    verifier, challenge = pkce()
    location = sign_in(requests.Session(), authorization_url(idp, challenge, **changes), "alice", PASSWORD)
    assert location.startswith(REDIRECT_URI + "?")
    return query_of(location)["code"], verifier


def exchange(idp, code, verifier, auth=("workspace", SECRET), **form):
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT_URI,
        "code_verifier": verifier,
        **form,
    }
    return requests.post(
        f"{idp.issuer}/api/oidc/token", data={k: v for k, v in data.items() if v is not None}, auth=auth, timeout=10
    )


def test_discovery_has_authelias_paths_and_only_what_the_registration_allows(idp, metadata):
    issuer = idp.issuer
    assert issuer.startswith("http://127.0.0.1:")
    assert metadata["issuer"] == issuer
    assert metadata["authorization_endpoint"] == f"{issuer}/api/oidc/authorization"
    assert metadata["token_endpoint"] == f"{issuer}/api/oidc/token"
    assert metadata["userinfo_endpoint"] == f"{issuer}/api/oidc/userinfo"
    assert metadata["jwks_uri"] == f"{issuer}/jwks.json"
    assert metadata["response_types_supported"] == ["code"]
    assert metadata["grant_types_supported"] == ["authorization_code"]
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert metadata["token_endpoint_auth_methods_supported"] == ["client_secret_basic"]
    assert metadata["id_token_signing_alg_values_supported"] == ["RS256"]
    assert metadata["scopes_supported"] == ["openid", "profile", "email", "groups"]
    assert metadata["subject_types_supported"] == ["public"]


def test_code_flow_with_pkce_gives_a_signed_minimal_id_token_and_a_full_userinfo(idp, metadata):
    browser = requests.Session()
    verifier, challenge = pkce()
    url = authorization_url(idp, challenge, nonce="nonce-0123456789")

    form = browser.get(url, allow_redirects=False, timeout=10)
    assert form.status_code == 200 and 'name="password"' in form.text
    signed_in = browser.post(url, data={"username": "alice", "password": PASSWORD}, allow_redirects=False, timeout=10)
    assert signed_in.status_code == 302
    location = signed_in.headers["Location"]
    assert location.startswith(REDIRECT_URI + "?")
    params = query_of(location)
    assert params["state"] == "state-0123456789"

    response = exchange(idp, params["code"], verifier)
    assert response.status_code == 200, response.text
    token = response.json()
    assert token["token_type"] == "Bearer" and token["expires_in"] > 0
    assert token["access_token"] and token["id_token"]

    # The signature, checked with the published key, and the claims, checked as authlib's
    # OIDC client checks them (iss, aud, exp, iat, nonce, at_hash).
    keys = KeySet.import_key_set(requests.get(metadata["jwks_uri"], timeout=10).json())
    id_token = jwt.decode(token["id_token"], keys, algorithms=["RS256"])
    claims = CodeIDToken(
        id_token.claims,
        id_token.header,
        {"iss": {"values": [idp.issuer]}},
        {"nonce": "nonce-0123456789", "client_id": "workspace", "access_token": token["access_token"]},
    )
    claims.validate()
    assert claims["aud"] == ["workspace"] and claims["sub"] and claims["auth_time"] <= time.time()
    # Minimal like Authelia's: who and for whom, but no profile, email or groups.
    assert not {"email", "email_verified", "groups", "name", "preferred_username"} & set(claims)
    header, payload, signature = token["id_token"].split(".")
    forged = base64.urlsafe_b64encode(b'{"sub":"mallory"}').rstrip(b"=").decode()
    with pytest.raises(BadSignatureError):
        jwt.decode(f"{header}.{forged}.{signature}", keys, algorithms=["RS256"])

    info = requests.get(
        metadata["userinfo_endpoint"], timeout=10, headers={"Authorization": f"Bearer {token['access_token']}"}
    )
    assert info.status_code == 200
    assert info.json() == {
        "sub": claims["sub"],
        "email": "alice@example.com",
        "email_verified": True,
        "preferred_username": "alice",
        "name": "Alice",
        "groups": ["admins"],
    }

    # Signed in at the provider, the next authorization skips the form (implicit consent).
    again = browser.get(authorization_url(idp, pkce()[1]), allow_redirects=False, timeout=10)
    assert again.status_code == 302 and "code" in query_of(again.headers["Location"])


def test_authlibs_own_client_completes_the_flow(idp, metadata):
    """The workspace signs in with authlib's client: it must interoperate as is."""
    client = OAuth2Session(
        "workspace",
        SECRET,
        scope="openid profile email groups",
        redirect_uri=REDIRECT_URI,
        code_challenge_method="S256",
        token_endpoint_auth_method="client_secret_basic",
    )
    verifier = secrets.token_urlsafe(48)
    url, _ = client.create_authorization_url(
        metadata["authorization_endpoint"], code_verifier=verifier, nonce="nonce-from-authlib"
    )
    location = sign_in(requests.Session(), url, "alice", PASSWORD)
    token = client.fetch_token(metadata["token_endpoint"], authorization_response=location, code_verifier=verifier)
    assert "id_token" in token
    assert client.get(metadata["userinfo_endpoint"], timeout=10).json()["email"] == "alice@example.com"


def test_userinfo_holds_only_what_the_scopes_grant(idp):
    code, verifier = new_code(idp, scope="openid")
    token = exchange(idp, code, verifier).json()
    info = requests.get(
        f"{idp.issuer}/api/oidc/userinfo", timeout=10, headers={"Authorization": f"Bearer {token['access_token']}"}
    )
    assert list(info.json()) == ["sub"]
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        assert requests.get(f"{idp.issuer}/api/oidc/userinfo", headers=headers, timeout=10).status_code == 401


@pytest.mark.parametrize(
    "auth, form, error",
    [
        (("workspace", "wrong-secret"), {}, "invalid_client"),
        (("someone-else", SECRET), {}, "invalid_client"),
        # client_secret_post: the right secret, in the body instead of HTTP Basic.
        (None, {"client_id": "workspace", "client_secret": SECRET}, "invalid_client"),
    ],
)
def test_token_endpoint_accepts_client_secret_basic_only(idp, auth, form, error):
    code, verifier = new_code(idp)
    response = exchange(idp, code, verifier, auth=auth, **form)
    assert response.status_code == 401
    assert response.json()["error"] == error
    assert "access_token" not in response.json()


@pytest.mark.parametrize(
    "verifier, status, error",
    [
        (None, 400, "invalid_request"),
        (secrets.token_urlsafe(48), 400, "invalid_grant"),
    ],
)
def test_token_endpoint_checks_the_pkce_verifier(idp, verifier, status, error):
    code, _ = new_code(idp)
    response = exchange(idp, code, verifier)
    assert (response.status_code, response.json()["error"]) == (status, error)


def test_a_code_is_used_once(idp):
    code, verifier = new_code(idp)
    assert exchange(idp, code, verifier).status_code == 200
    reused = exchange(idp, code, verifier)
    assert (reused.status_code, reused.json()["error"]) == (400, "invalid_grant")


def test_token_request_must_repeat_the_redirect_uri(idp):
    code, verifier = new_code(idp)
    response = exchange(idp, code, verifier, redirect_uri=None)
    assert (response.status_code, response.json()["error"]) == (400, "invalid_grant")


@pytest.mark.parametrize(
    "changes, error",
    [
        ({"code_challenge": None, "code_challenge_method": None}, "invalid_request"),
        ({"code_challenge_method": None}, "invalid_request"),
        ({"code_challenge_method": "plain"}, "invalid_request"),
        ({"response_type": "token"}, "unsupported_response_type"),
        ({"scope": "openid offline_access"}, "invalid_scope"),
        ({"state": None}, "invalid_state"),
    ],
)
def test_refusals_for_a_known_client_go_back_to_its_redirect_uri(idp, changes, error):
    verifier, challenge = pkce()
    response = requests.get(authorization_url(idp, challenge, **changes), allow_redirects=False, timeout=10)
    assert response.status_code == 302
    location = response.headers["Location"]
    assert location.startswith(REDIRECT_URI + "?")
    assert query_of(location)["error"] == error
    assert "code" not in query_of(location)


@pytest.mark.parametrize(
    "changes",
    [
        {"client_id": "unknown"},
        {"redirect_uri": REDIRECT_URI + "/"},  # not exactly it
        {"redirect_uri": "https://evil.example/api/v2/users/oidc/callback"},
        {"redirect_uri": None},
    ],
)
def test_unknown_client_or_redirect_uri_gets_an_error_page_never_a_redirect(idp, changes):
    response = requests.get(authorization_url(idp, pkce()[1], **changes), allow_redirects=False, timeout=10)
    assert response.status_code == 400
    assert "Location" not in response.headers
    assert response.headers["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("username, password", [("mallory", PASSWORD), ("alice", "wrong password")])
def test_login_form_refuses_unknown_user_and_wrong_password_alike(idp, username, password):
    browser = requests.Session()
    url = authorization_url(idp, pkce()[1])
    response = browser.post(url, data={"username": username, "password": password}, allow_redirects=False, timeout=10)
    assert response.status_code == 401
    assert "Incorrect username or password." in response.text
    assert "Location" not in response.headers
    # Not signed in: the next request shows the form again.
    assert browser.get(url, allow_redirects=False, timeout=10).status_code == 200


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"redirect_uris": [REDIRECT_URI, "https://other.example/cb"]}, "exactly one redirect URI"),
        ({"redirect_uris": []}, "exactly one redirect URI"),
        ({"token_endpoint_auth_method": "client_secret_post"}, "token_endpoint_auth_method"),
        ({"pkce_challenge_method": "plain"}, "pkce_challenge_method"),
        ({"public": True}, "public"),
        ({"client_secret_digest": SECRET}, "pbkdf2-sha512"),
        ({"client_secret": SECRET}, "only the digest"),
    ],
)
def test_config_the_provider_cannot_honour_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        OidcProvider(make_config(**changes))


def test_digest_round_trip_and_format():
    digest = pbkdf2_sha512_digest("s3cret")
    assert digest.startswith("$pbkdf2-sha512$310000$")
    rounds, salt, checksum = parse_pbkdf2_sha512(digest)
    assert (rounds, len(salt), len(checksum)) == (310000, 16, 64)
    assert "=" not in digest and "+" not in digest  # passlib's adapted base64
    assert verify_pbkdf2_sha512("s3cret", digest)
    assert not verify_pbkdf2_sha512("s3cret ", digest)
    assert not verify_pbkdf2_sha512("S3cret", digest)
    assert pbkdf2_sha512_digest("s3cret") != digest  # a fresh salt each time


def test_digest_matches_authelias_documented_example():
    assert verify_pbkdf2_sha512("insecure_secret", AUTHELIA_DIGEST)
    assert not verify_pbkdf2_sha512("secure_secret", AUTHELIA_DIGEST)
    rounds, salt, _ = parse_pbkdf2_sha512(AUTHELIA_DIGEST)
    assert pbkdf2_sha512_digest("insecure_secret", salt=salt, rounds=rounds) == AUTHELIA_DIGEST


def test_down_knob_counts_and_restart():
    with OidcProvider(make_config()) as provider:
        url = provider.discovery_url
        assert requests.get(url, timeout=10).status_code == 200
        provider.down = True
        assert requests.get(url, timeout=10).status_code == 503
        provider.down = 502
        assert requests.get(url, timeout=10).status_code == 502
        provider.down = "close"
        with pytest.raises(requests.ConnectionError):
            requests.get(url, timeout=10)
        provider.down = False
        assert provider.counts["discovery"] == 3  # a dropped connection never reaches the app

        provider.stop()
        with pytest.raises(requests.ConnectionError):
            requests.get(url, timeout=10)
        provider.start()  # same port, same issuer, same key
        assert requests.get(url, timeout=10).json()["issuer"] == provider.issuer


def test_https_issuer_behind_a_proxy():
    config = {**make_config(), "issuer": "https://auth.example"}
    with OidcProvider(config) as provider:
        assert provider.issuer == "https://auth.example"
        local = f"http://127.0.0.1:{provider.port}"
        proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "auth.example"}
        assert (
            requests.get(local + "/.well-known/openid-configuration", headers=proxied, timeout=10).json()[
                "token_endpoint"
            ]
            == "https://auth.example/api/oidc/token"
        )
        url = authorization_url(provider, pkce()[1]).replace(provider.issuer, local)
        assert requests.get(url, headers=proxied, allow_redirects=False, timeout=10).status_code == 200
