"""The browser libraries the services serve from their own files (no CDN): Swagger UI
for the notebook's /docs, xterm.js for the workspace terminal.

`python3 -m devtools.browser_assets` puts each package, at its pinned version, where
the service reads it (ignored by git). It needs only the standard library and the npm
registry, not npm: the tarball is checked against the registry's sha512 integrity
before anything is unpacked, and unpacked next to its place then renamed into it, so
an interrupted run never leaves half a package. `make setup` and the playbook both
run it; a package already at its version is left alone.
"""

import base64
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "https://registry.npmjs.org"

# (package, version, sha512 integrity from the registry, folder below the checkout)
PACKAGES = [
    (
        "swagger-ui-dist",
        "5.35.0",
        "sha512-U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ==",
        "app/notebook/vendor/node_modules/swagger-ui-dist",
    ),
    (
        "@xterm/xterm",
        "6.0.0",
        "sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==",
        "app/workspace/vendor/node_modules/@xterm/xterm",
    ),
    (
        "@xterm/addon-fit",
        "0.11.0",
        "sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==",
        "app/workspace/vendor/node_modules/@xterm/addon-fit",
    ),
]


def installed_version(folder):
    try:
        return json.loads((folder / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def tarball_url(package, version):
    return f"{REGISTRY}/{package}/-/{package.rsplit('/', 1)[-1]}-{version}.tgz"


def download(url, integrity):
    """The tarball's bytes, refused unless their sha512 is the pinned one."""
    with urllib.request.urlopen(url, timeout=60) as response:
        data = response.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != integrity:
        raise RuntimeError(f"{url}: sha512 does not match the pinned integrity")
    return data


def _inside_package(name):
    parts = Path(name).parts
    return len(parts) > 1 and parts[0] == "package" and ".." not in parts and not Path(name).is_absolute()


def unpack(data, folder):
    """npm tarballs hold one `package/` folder: its regular files and folders only."""
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=folder.parent))
    with tempfile.TemporaryFile() as archive:
        archive.write(data)
        archive.seek(0)
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and _inside_package(m.name)]
            # The "data" filter also drops odd modes; Pythons without it get the checks above.
            options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staging, members=members, **options)
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    (staging / "package").rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)


def ensure(package, version, integrity, relative):
    """True when it had to be installed."""
    folder = ROOT / relative
    if installed_version(folder) == version:
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    unpack(download(tarball_url(package, version), integrity), folder)
    return True


def main():
    for package, version, integrity, relative in PACKAGES:
        if ensure(package, version, integrity, relative):
            print(f"installed {package}@{version} in {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
