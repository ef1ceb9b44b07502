"""Issues this data host's certificate for pgBackRest's TLS server and client (the HA
tier: the leader's backup reaches the standbys' pgBackRest servers with it).

    python3 bundle_pgbackrest_tls.py SECRETS_FILE FOLDER ADDRESS --owner postgres

Writes into FOLDER: ca.crt, the tier's certificate authority (pgbackrest_tls_ca of the
secrets file, the same on the three hosts); host.key, made once; host.crt, CN
bundle-pgbackrest (the client name the servers accept), for ADDRESS, signed by the CA,
valid ten years. host.crt is issued again when it is missing, signed by another CA, for
another address, or within a year of its end. Prints "changed" when it wrote, nothing
else. Standard library and the openssl command only: it runs with the host's python3.
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile

CLIENT_NAME = "bundle-pgbackrest"
DAYS = 3650
RENEW_BEFORE_SECONDS = 365 * 24 * 3600


def openssl(*argv, check=True):
    return subprocess.run(["openssl", *argv], capture_output=True, text=True, check=check)


def subject_alternative_names(address):
    # pgBackRest 2.45 matches its pgN-host against DNS names only: the address as both.
    return f"subjectAltName=IP:{address},DNS:{address}"


def current(folder, address):
    """Whether host.crt is signed by ca.crt, names `address` and is not near its end."""
    crt, ca = os.path.join(folder, "host.crt"), os.path.join(folder, "ca.crt")
    if not os.path.exists(crt):
        return False
    if openssl("verify", "-CAfile", ca, crt, check=False).returncode != 0:
        return False
    if openssl("x509", "-in", crt, "-noout", "-checkend", str(RENEW_BEFORE_SECONDS), check=False).returncode != 0:
        return False
    shown = openssl("x509", "-in", crt, "-noout", "-ext", "subjectAltName", check=False).stdout.splitlines()[1:]
    return f"DNS:{address}" in {name.strip() for line in shown for name in line.split(",")}


def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write(path, text, mode, owner=None):
    temporary = f"{path}.new"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    if owner:
        shutil.chown(temporary, user=owner, group=owner)
    os.replace(temporary, path)


def issue(folder, address, ca_key, owner):
    """host.crt for `address`, signed by the CA whose key is `ca_key` (kept in a private temporary folder)."""
    with tempfile.TemporaryDirectory() as scratch:
        key_file, csr, extensions = (os.path.join(scratch, name) for name in ("ca.key", "host.csr", "ext.cnf"))
        write(key_file, ca_key, 0o600)
        with open(extensions, "w") as handle:
            handle.write(f"{subject_alternative_names(address)}\nextendedKeyUsage=serverAuth,clientAuth\n")
        host_key = os.path.join(folder, "host.key")
        openssl("req", "-new", "-key", host_key, "-subj", f"/CN={CLIENT_NAME}", "-out", csr)
        signed = openssl(
            "x509", "-req", "-in", csr, "-CA", os.path.join(folder, "ca.crt"), "-CAkey", key_file,
            "-set_serial", str(int.from_bytes(os.urandom(16), "big")), "-days", str(DAYS), "-extfile", extensions,
        )  # fmt: skip
        write(os.path.join(folder, "host.crt"), signed.stdout, 0o644, owner)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("secrets_file")
    parser.add_argument("folder")
    parser.add_argument("address")
    parser.add_argument("--owner", default="postgres")
    args = parser.parse_args()
    with open(args.secrets_file) as handle:
        secrets = json.load(handle)
    changed = False
    os.makedirs(args.folder, mode=0o755, exist_ok=True)
    ca = os.path.join(args.folder, "ca.crt")
    if read(ca) != secrets["pgbackrest_tls_ca"]:
        write(ca, secrets["pgbackrest_tls_ca"], 0o644, args.owner)
        changed = True
    host_key = os.path.join(args.folder, "host.key")
    if not os.path.exists(host_key):
        key = openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1").stdout
        write(host_key, key, 0o600, args.owner)
        changed = True
    if changed or not current(args.folder, args.address):
        issue(args.folder, args.address, secrets["pgbackrest_tls_ca_key"], args.owner)
        changed = True
    if changed:
        print("changed")


if __name__ == "__main__":
    main()
