"""Feed the Authelia-shaped stand-in (devtools/oidc_provider.py) from Authelia's own
configuration: the `identity_providers.oidc.clients` registration that the
identity_provider role of ops/ renders for the real Authelia, plus a users file in
the stand-in's format (plain passwords: test hosts only).

    python -m devtools.authelia_config serve --authelia-config /etc/authelia/oidc-clients.yml \\
        --users users.yml [--issuer URL] [--host 127.0.0.1] [--port 9091]
    python -m devtools.authelia_config convert --authelia-config FILE [--users FILE]   # prints JSON

Not app code: imports nothing from app/.
"""

import argparse
import json
import os
import sys
import tempfile

from devtools import oidc_provider

# Authelia's key -> the stand-in's key (the stand-in checks every value itself).
CLIENT_KEYS = {
    "client_id": "client_id",
    "id": "client_id",
    "client_name": "client_name",
    "client_secret": "client_secret_digest",
    "public": "public",
    "authorization_policy": "authorization_policy",
    "consent_mode": "consent_mode",
    "pkce_challenge_method": "pkce_challenge_method",
    "redirect_uris": "redirect_uris",
    "scopes": "scopes",
    "grant_types": "grant_types",
    "response_types": "response_types",
    "token_endpoint_auth_method": "token_endpoint_auth_method",
}


def convert_client(entry):
    if not isinstance(entry, dict):
        raise ValueError("each client of identity_providers.oidc.clients is a mapping")
    unknown = set(entry) - set(CLIENT_KEYS) - {"require_pkce"}
    if unknown:
        raise ValueError(f"client keys the stand-in does not know: {', '.join(sorted(unknown))}")
    if entry.get("require_pkce") is not True:
        raise ValueError("the registration must require PKCE (require_pkce: true)")
    return {CLIENT_KEYS[key]: value for key, value in entry.items() if key in CLIENT_KEYS}


def load(authelia_config, users=None, issuer=None):
    """The stand-in's config dict from Authelia's configuration file (and a users file
    with `users: [...]` in the stand-in's format)."""
    document = oidc_provider.load_config_file(authelia_config)
    clients = ((document.get("identity_providers") or {}).get("oidc") or {}).get("clients")
    if not isinstance(clients, list) or not clients:
        raise ValueError("no identity_providers.oidc.clients in the Authelia configuration")
    config = {"clients": [convert_client(c) for c in clients], "users": []}
    if users:
        config["users"] = oidc_provider.load_config_file(users).get("users") or []
    if issuer:
        config["issuer"] = issuer
    return config


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m devtools.authelia_config",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["serve", "convert"])
    parser.add_argument("--authelia-config", required=True, help="YAML with identity_providers.oidc.clients")
    parser.add_argument("--users", help="YAML with users: [{username, password, email, groups?}]")
    parser.add_argument("--issuer", help="the public issuer URL (default: the address served on)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9091)
    args = parser.parse_args(argv)
    try:
        config = load(args.authelia_config, args.users, args.issuer)
    except (OSError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    if args.command == "convert":
        json.dump(config, sys.stdout, indent=2)
        print()
        return 0
    # The stand-in's command line takes a config file: hand it a private converted copy.
    with tempfile.TemporaryDirectory(prefix="authelia-standin-") as directory:
        path = os.path.join(directory, "config.json")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            json.dump(config, handle)
        return oidc_provider.main(["serve", "--config", path, "--host", args.host, "--port", str(args.port)])


if __name__ == "__main__":
    sys.exit(main())
