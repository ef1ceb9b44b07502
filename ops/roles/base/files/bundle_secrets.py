"""Keeps the bundle's generated secrets in one root-only JSON file (mode 0600).

    python3 bundle_secrets.py FILE ensure NAME=KIND ...   # adds the missing ones
    python3 bundle_secrets.py FILE rotate NAME=KIND       # replaces one
    python3 bundle_secrets.py FILE import PATTERN ... < OTHER_FILE
        # takes the names matching the (shell-style) patterns from another host's
        # secrets file on stdin, e.g. 'postgresql_*' 'redis_password' from the data host

Prints "changed" when it wrote the file, nothing else: never a secret. Kinds:
token (32 random bytes, URL-safe base64), fernet (a Fernet key), client_secret (a
token as NAME and its PBKDF2-SHA512 digest in Authelia's format as NAME_digest),
tls_ca (a private certificate authority: its certificate as NAME, PEM, valid 100
years, and its key as NAME_key; made with the openssl command).
Standard library only: it runs with the host's python3 before any venv exists.
"""

import base64
import fnmatch
import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile

ROUNDS = 310000  # Authelia's default for pbkdf2-sha512


def ab64(raw):
    """passlib's 'adapted base64' (Authelia's modular crypt format): '.' for '+', no padding."""
    return base64.b64encode(raw).decode().rstrip("=").replace("+", ".")


def pbkdf2_sha512(secret):
    salt = secrets.token_bytes(16)
    checksum = hashlib.pbkdf2_hmac("sha512", secret.encode(), salt, ROUNDS)
    return f"$pbkdf2-sha512${ROUNDS}${ab64(salt)}${ab64(checksum)}"


def certificate_authority(name):
    """A P-256 key and its self-signed CA certificate (PEM), named CN=`name`."""
    with tempfile.TemporaryDirectory() as folder:
        key, crt = os.path.join(folder, "ca.key"), os.path.join(folder, "ca.crt")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            + ["-days", "36500", "-subj", f"/CN={name}", "-keyout", key, "-out", crt],
            check=True,
            capture_output=True,
        )
        with open(crt) as certificate, open(key) as private:
            return certificate.read(), private.read()


def generate(name, kind):
    if kind == "token":
        return {name: secrets.token_urlsafe(32)}
    if kind == "fernet":
        return {name: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()}
    if kind == "client_secret":
        value = secrets.token_urlsafe(48)
        return {name: value, f"{name}_digest": pbkdf2_sha512(value)}
    if kind == "tls_ca":
        certificate, key = certificate_authority(name.replace("_", "-"))
        return {name: certificate, f"{name}_key": key}
    raise SystemExit(f"bundle_secrets: unknown kind {kind!r}")


def imported(other, patterns):
    """The entries of `other` whose names match one of `patterns` (each must match one)."""
    if not patterns:
        raise SystemExit("bundle_secrets: import needs the names (or patterns) to take")
    taken = {}
    for pattern in patterns:
        names = fnmatch.filter(sorted(other), pattern)
        if not names:
            raise SystemExit(f"bundle_secrets: nothing named {pattern!r} in the secrets given on stdin")
        taken.update((name, other[name]) for name in names)
    return taken


def main(path, action, *specs):
    try:
        with open(path) as handle:
            stored = json.load(handle)
    except FileNotFoundError:
        stored = {}
    updated = dict(stored)
    if action == "import":
        updated.update(imported(json.load(sys.stdin), specs))
    else:
        wanted = dict(spec.split("=", 1) for spec in specs)
        for name, kind in wanted.items():
            if action == "rotate" or name not in updated:
                updated.update(generate(name, kind))
    if updated == stored:
        return
    temporary = f"{path}.new"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(updated, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    print("changed")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in ("ensure", "rotate", "import"):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
