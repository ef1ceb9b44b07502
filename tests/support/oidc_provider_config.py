"""The client and user the devtools OpenID provider's own tests register: one
confidential client (`workspace`, its secret known as a pbkdf2-sha512 digest) and alice."""

from devtools.oidc_provider import pbkdf2_sha512_digest

REDIRECT_URI = "https://workspace.example/api/v2/users/oidc/callback"
SECRET = "a-long-random-client-secret-for-the-tests"
PASSWORD = "correct horse battery staple"
DIGEST = pbkdf2_sha512_digest(SECRET, rounds=1000)


def make_config(**client):
    """The provider's configuration; `client` overrides the client's fields."""
    return {
        "clients": [
            {
                "client_id": "workspace",
                "client_secret_digest": DIGEST,
                "public": False,
                "authorization_policy": "one_factor",
                "consent_mode": "implicit",
                "token_endpoint_auth_method": "client_secret_basic",
                "redirect_uris": [REDIRECT_URI],
                "scopes": ["openid", "profile", "email", "groups"],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "pkce_challenge_method": "S256",
                **client,
            }
        ],
        "users": [
            {
                "username": "alice",
                "password": PASSWORD,
                "email": "alice@example.com",
                "email_verified": True,
                "name": "Alice",
                "groups": ["admins"],
            }
        ],
    }
