"""Static checks of the ops bundle: the playbooks lint clean (production profile) and
parse, the units verify and stay within the documented exposure, every nginx site
renders and passes `nginx -t`, and the secrets and provider registration tools work.
The staging box (test_staging.py) runs all of it for real."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools import authelia_config, nginx, oidc_provider, staging
from tests.support.ops import ansible_like, venv_tool

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
UNITS = ("bundle@.service", "bundle-worker@.service")
# `systemd-analyze security` overall exposure (0 = locked down, 10 = unprotected).
# bundle@ measures 1.6 ("OK"); what remains is the network (the services serve and
# call out), the user-visible /home-less filesystem and the default UMask group bits.
EXPOSURE_THRESHOLD = 2.0
# bundle-backup.service runs as root (it reads every service's folder and the secrets
# file, and a restic repository may be a local disk anywhere under /var, /srv or /mnt):
# 2.4, the rest of its sandbox as bundle@'s.
EXPOSURE_THRESHOLDS = {"bundle-backup.service": 2.5}
SECRETS = OPS / "roles/base/files/bundle_secrets.py"


def test_ansible_lint_production_profile():
    result = subprocess.run(
        [
            venv_tool("ansible-lint"),
            "--offline",
            "--profile",
            "production",
            "--nocolor",
            "site.yml",
            "rotate-oidc-secret.yml",
            "roles",
        ],
        cwd=OPS,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ANSIBLE_LOCAL_TEMP": "/tmp"},
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]


@pytest.mark.parametrize("playbook", ["site.yml", "rotate-oidc-secret.yml"])
def test_playbook_syntax(playbook):
    result = subprocess.run(
        [venv_tool("ansible-playbook"), "--syntax-check", "-i", "localhost,", playbook],
        cwd=OPS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def installed_units(tmp_path):
    """The units as installed, with /opt/bundle pointing at a stub tree here (verify
    checks that ExecStart's program exists)."""
    install = tmp_path / "opt-bundle"
    (install / ".venv/bin").mkdir(parents=True)
    for program in ("gunicorn", "python", "bundle-backup"):
        (install / ".venv/bin" / program).write_text("#!/bin/sh\n")
        (install / ".venv/bin" / program).chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for name, instance in (
        ("bundle@.service", "bundle@decks.service"),
        ("bundle@.socket", "bundle@decks.socket"),
        ("bundle-worker@.service", "bundle-worker@notebook.service"),
        ("bundle-backup.service", "bundle-backup.service"),
        ("bundle-backup.timer", "bundle-backup.timer"),
        ("bundle-pg-backup@.service", "bundle-pg-backup@full.service"),
        ("bundle-pg-backup@.timer", "bundle-pg-backup@full.timer"),
    ):
        text = (ROOT / "systemd" / name).read_text().replace("/opt/bundle", str(install))
        text = text.replace("/usr/local/sbin/bundle-backup", str(install / ".venv/bin/bundle-backup"))
        (units / instance).write_text(text)
    # The timers' schedules and the pgBackRest unit's folders, as the roles write them.
    for timer in ("bundle-backup.timer", "bundle-pg-backup@full.timer"):
        (units / f"{timer}.d").mkdir()
        (units / f"{timer}.d" / "schedule.conf").write_text(
            "[Timer]\nOnCalendar=*-*-* 02:30:00\nRandomizedDelaySec=30min\n"
        )
    (units / "bundle-pg-backup@full.service.d").mkdir()
    (units / "bundle-pg-backup@full.service.d" / "paths.conf").write_text(
        "[Service]\nReadWritePaths=/var/lib/pgbackrest /var/log/pgbackrest /var/spool/pgbackrest\n"
    )
    # The socket's address, as the services role writes it (a socket without one does not verify).
    (units / "bundle@decks.socket.d").mkdir()
    (units / "bundle@decks.socket.d" / "listen.conf").write_text("[Socket]\nListenStream=127.0.0.1:7081\n")
    return units


def test_units_verify_without_a_word(installed_units):
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is missing (apt-get install systemd)")
    for unit in sorted(p for p in installed_units.iterdir() if p.is_file()):
        result = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60, cwd="/"
        )
        assert result.returncode == 0 and result.stderr == "", f"{unit.name}: {result.stderr}"


def test_unit_exposure_is_under_the_threshold(installed_units):
    for unit in sorted(installed_units.glob("*.service")):
        result = subprocess.run(
            [
                "systemd-analyze",
                "security",
                "--offline=true",
                "--no-pager",
                f"--threshold={int(EXPOSURE_THRESHOLDS.get(unit.name, EXPOSURE_THRESHOLD) * 10)}",
                str(unit),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout).group(1))
        assert score <= EXPOSURE_THRESHOLDS.get(unit.name, EXPOSURE_THRESHOLD), result.stdout[-3000:]
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def test_unit_contract():
    unit = (ROOT / "systemd/bundle@.service").read_text()
    for line in (
        "EnvironmentFile=/etc/bundle/%i.env",
        "Environment=SERVICE=%i",
        "Type=notify",
        "Restart=on-failure",
        "RestartSec=5",
        "TimeoutStopSec=20",
        "KillMode=mixed",
        "User=bundle",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/bundle/%i",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "NoNewPrivileges=yes",
        "ExecStart=/opt/bundle/.venv/bin/gunicorn -c gunicorn.conf.py wsgi:app",
    ):
        assert line in unit.splitlines(), line


def _self_signed(directory):
    crt, key = directory / "bundle.crt", directory / "bundle.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=workspace.example.org",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return crt, key


def test_every_site_passes_nginx_t_with_production_variables(tmp_path):
    """Rendered as the nginx role renders them (TLS, every host, the redirect server with
    ACME's challenges, the identity provider's site), then `nginx -t` in a throw-away prefix."""
    crt, key = _self_signed(tmp_path)
    apps = tmp_path / "apps"
    apps.mkdir()
    apps_crt, apps_key = _self_signed(apps)
    services = nginx.site_services()
    variables = nginx.variables_for(
        443,
        {s: f"127.0.0.1:{7080 + i}" for i, s in enumerate(services)},
        hosts={s: f"{s}.example.org" for s in services},
        listen_address=["127.0.0.1"],
        tls_certificate=crt,
        tls_certificate_key=key,
        http2=True,
        http_redirect_port=80,
        listen_backlog=16384,  # the nginx role's nginx_listen_backlog
        acme_webroot=str(tmp_path / "acme"),
        wizard_uploads_dir=str(tmp_path / "uploads"),
        wizard_lists_dir=str(tmp_path / "lists"),
        wizard_auth_request_url="http://127.0.0.1:9091/api/authz/auth-request",
        # the workspace apps on their wildcard host, with its own certificate
        workspace_apps_host="*.apps.example.org",
        workspace_apps_tls_certificate=str(apps_crt),
        workspace_apps_tls_certificate_key=str(apps_key),
    )
    prefix = tmp_path / "prefix"
    nginx.render(prefix, variables)
    auth_site = (
        ansible_like(OPS / "roles/identity_provider/templates")
        .get_template("auth.conf.j2")
        .render(
            ansible_managed="test",
            nginx_listen_addresses=["127.0.0.1"],
            bundle_https_port=443,
            bundle_auth_host="auth.example.org",
            nginx_tls_certificate_path=crt,
            nginx_tls_certificate_key_path=key,
            nginx_snippets_dir="snippets",
            identity_provider_upstream="127.0.0.1:9091",
        )
    )
    (prefix / "sites/auth.conf").write_text(auth_site)
    result = nginx.test_config(prefix, check=False)
    assert result.returncode == 0, result.stderr
    assert {"workspace", "decks", "audio", "notebook"} <= set(services)
    assert "server_name *.apps.example.org;" in (prefix / "sites/workspace.conf").read_text()


def _secrets(path, *args):
    return subprocess.run(
        [sys.executable, str(SECRETS), str(path), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_secrets_are_made_once_kept_and_rotated(tmp_path):
    path = tmp_path / "secrets.json"
    specs = ["a=token", "b=fernet", "c=client_secret"]
    assert _secrets(path, "ensure", *specs) == "changed\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = json.loads(path.read_text())
    assert set(first) == {"a", "b", "c", "c_digest"}
    assert oidc_provider.verify_pbkdf2_sha512(first["c"], first["c_digest"])
    from cryptography.fernet import Fernet

    Fernet(first["b"].encode())  # a valid key
    assert _secrets(path, "ensure", *specs) == ""  # re-run: nothing printed, nothing changed
    assert json.loads(path.read_text()) == first
    assert _secrets(path, "rotate", "c=client_secret") == "changed\n"
    rotated = json.loads(path.read_text())
    assert rotated["a"] == first["a"] and rotated["c"] != first["c"]
    assert oidc_provider.verify_pbkdf2_sha512(rotated["c"], rotated["c_digest"])


def test_the_rendered_authelia_registration_feeds_the_stand_in(tmp_path):
    """The registration as the identity_provider role renders it for Authelia is the
    spec's table, and the stand-in provider accepts exactly that file."""
    digest = oidc_provider.pbkdf2_sha512_digest("s3cret", rounds=1000)
    text = (
        ansible_like(OPS / "roles/identity_provider/templates")
        .get_template("oidc-clients.yml.j2")
        .render(
            ansible_managed="test",
            bundle_oidc_client_id="workspace",
            identity_provider_client_name="Workspace",
            base_secret_values={"workspace_oidc_client_secret_digest": digest},
            bundle_hosts={"workspace": "workspace.example.org"},
            bundle_url_suffix="",
        )
    )
    client = yaml.safe_load(text)["identity_providers"]["oidc"]["clients"][0]
    assert client == {
        "client_id": "workspace",
        "client_name": "Workspace",
        "client_secret": digest,
        "public": False,
        "authorization_policy": "one_factor",
        "consent_mode": "implicit",
        "require_pkce": True,
        "pkce_challenge_method": "S256",
        "redirect_uris": ["https://workspace.example.org/api/v2/users/oidc/callback"],
        "scopes": ["openid", "profile", "email", "groups"],
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "client_secret_basic",
    }
    (tmp_path / "clients.yml").write_text(text)
    (tmp_path / "users.yml").write_text(
        yaml.safe_dump({"users": [{"username": "alice", "password": "pw", "email": "alice@example.org"}]})
    )
    config = authelia_config.load(tmp_path / "clients.yml", tmp_path / "users.yml", "https://auth.example.org")
    provider = oidc_provider.create_provider(config)
    assert list(provider.extensions["oidc_provider"].clients) == ["workspace"]
    client["require_pkce"] = False
    with pytest.raises(ValueError, match="PKCE"):
        authelia_config.convert_client(client)


def test_the_owner_password_is_made_with_the_other_secrets(tmp_path):
    """The base role's list (what it passes to `ensure`) has the Owner's password, made once."""
    wanted = yaml.safe_load((OPS / "roles/base/defaults/main.yml").read_text())["base_secrets"]
    path = tmp_path / "secrets.json"
    _secrets(path, "ensure", *[f"{name}={kind}" for name, kind in wanted.items()])
    first = json.loads(path.read_text())["workspace_owner_password"]
    assert len(first) >= 40
    _secrets(path, "ensure", *[f"{name}={kind}" for name, kind in wanted.items()])
    assert json.loads(path.read_text())["workspace_owner_password"] == first


def test_the_staging_cache_holds_every_package_the_playbook_installs():
    packages = set(staging.playbook_packages())
    assert {"ansible-core", "git", "nginx-light", "python3-venv", "espeak-ng", "restic"} <= packages
