"""The playbook's side of the workspace platform's app hosts (bundle_apps_host, a wildcard
name) and of its Owner: the roles' own tasks run by ansible-playbook on this machine.
The name is checked, the platform's environment file names the app hosts, the nginx role
picks the wildcard certificate (the admin's, ACME's through DNS-01, or a self-signed one)
and renders the workspace site with it, which nginx accepts. The staging box
(test_staging.py) obtains the certificate from pebble through DNS-01 and creates the Owner
for real."""

import json
import re
import subprocess

import pytest
import yaml

from app import registry
from devtools import nginx
from tests.support.ops import OPS, role_task, run_play

ROOT = OPS.parent
SERVICES = registry.NAMES
PORTS = {service: 7000 + i for i, service in enumerate(SERVICES)}
APPS = "*.apps.example.org"


def _failed(result):
    return result.returncode != 0 and "failed=1" in result.stdout


@pytest.mark.parametrize(
    ("name", "good"),
    [
        (APPS, True),
        ("", True),
        ("apps.example.org", False),
        ("*.apps.example.org:8443", False),
        ("*.Apps.example.org", False),
        ("*.org", False),
        ("*.apps.example.org/x", False),
    ],
)
def test_the_app_hosts_name_is_checked(tmp_path, name, good):
    result = run_play(
        tmp_path,
        [role_task("base", "Check the app hosts' name (bundle_apps_host)")],
        {"bundle_apps_host": name, "bundle_ports": PORTS},
    )
    assert (result.returncode == 0) == good, result.stdout[-3000:]
    if not good:
        assert "it must be a wildcard host name" in result.stdout


def _env_files(tmp_path, **variables):
    etc = tmp_path / "etc"
    etc.mkdir()
    task = role_task("services", "Write each service's environment file")
    task = {k: v for k, v in task.items() if k != "no_log"}
    task["ansible.builtin.template"]["src"] = str(OPS / "roles/services/templates/service.env.j2")
    result = run_play(
        tmp_path,
        [{"ansible.builtin.import_tasks": str(OPS / "roles/services/tasks/data_urls.yml")}, task],
        {
            "bundle_config_dir": str(etc),
            "bundle_user": "root",
            "bundle_ports": PORTS,
            "base_services": ["workspace"],
            "base_secret_values": {"workspace_oidc_client_secret": "oidc"},
            **variables,
        },
        roles=("base", "services"),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return dict(
        re.match(r'^(\w+)="(.*)"$', line).groups()
        for line in (etc / "workspace.env").read_text().splitlines()
        if line and not line.startswith("#")
    )


def test_the_platform_is_told_its_app_hosts(tmp_path):
    values = _env_files(tmp_path, bundle_apps_host=APPS, bundle_https_port=8443)
    assert values["WORKSPACE_WILDCARD_ACCESS_URL"] == f"{APPS}:8443"  # the scheme is the access URL's
    assert values["WORKSPACE_ACCESS_URL"] == "https://workspace.example.org:8443"


def test_without_app_hosts_the_platform_serves_apps_on_paths_only(tmp_path):
    assert "WORKSPACE_WILDCARD_ACCESS_URL" not in _env_files(tmp_path)


def _certificate_choice(tmp_path, **variables):
    """The nginx role's check of the app hosts' certificate settings, then what it serves."""
    out = tmp_path / "choice.json"
    write = {
        "name": "Write what the role chose",
        "ansible.builtin.copy": {
            "dest": str(out),
            "mode": "0644",
            "content": "{{ {'crt': nginx_apps_tls_certificate_path, 'key': nginx_apps_tls_certificate_key_path,"
            " 'acme': nginx_apps_acme | bool, 'self_signed': nginx_apps_self_signed | bool} | to_json }}",
        },
    }
    result = run_play(
        tmp_path,
        [role_task("nginx", "Check the app hosts' certificate settings"), write],
        {"bundle_apps_host": APPS, "bundle_ports": PORTS, **variables},
        roles=("base", "nginx"),
    )
    return result, json.loads(out.read_text()) if out.exists() else None


def test_the_app_hosts_certificate_is_the_admins_or_acmes_or_self_signed(tmp_path):
    cases = [
        (
            {
                "nginx_apps_tls_certificate": "/etc/ssl/apps.pem",
                "nginx_apps_tls_certificate_key": "/etc/ssl/apps.key",
                "nginx_acme_email": "admin@example.org",
            },
            {"crt": "/etc/ssl/apps.pem", "key": "/etc/ssl/apps.key", "acme": False, "self_signed": False},
        ),
        (
            {"nginx_acme_email": "admin@example.org", "nginx_acme_dns_auth_hook": "/usr/local/sbin/dns set"},
            {
                "crt": "/etc/bundle/tls/apps-served.crt",
                "key": "/etc/bundle/tls/apps-served.key",
                "acme": True,
                "self_signed": True,
            },
        ),
        (
            {"nginx_tls_certificate": "/etc/ssl/all.pem", "nginx_tls_certificate_key": "/etc/ssl/all.key"},
            {"crt": "/etc/ssl/all.pem", "key": "/etc/ssl/all.key", "acme": False, "self_signed": False},
        ),
        (
            {},
            {"crt": "/etc/bundle/tls/apps.crt", "key": "/etc/bundle/tls/apps.key", "acme": False, "self_signed": True},
        ),
    ]
    for number, (variables, expected) in enumerate(cases):
        folder = tmp_path / str(number)
        folder.mkdir()
        result, chosen = _certificate_choice(folder, **variables)
        assert result.returncode == 0, result.stdout[-3000:]
        assert chosen == expected, variables


@pytest.mark.parametrize(
    "variables",
    [
        {"nginx_acme_email": "admin@example.org"},  # http-01 cannot issue a wildcard name
        {"nginx_apps_tls_certificate": "/etc/ssl/apps.pem"},  # a certificate without its key
    ],
)
def test_a_wildcard_host_without_a_way_to_its_certificate_stops_the_play(tmp_path, variables):
    result, chosen = _certificate_choice(tmp_path, **variables)
    assert _failed(result) and chosen is None, result.stdout[-3000:]
    assert "needs a certificate for its wildcard name" in result.stdout


def _self_signed(folder, name, san):
    crt, key = folder / f"{name}.crt", folder / f"{name}.key"
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
            f"/CN={san}",
            "-addext",
            f"subjectAltName=DNS:{san}",
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


def test_the_nginx_role_serves_the_app_hosts_with_their_certificate(tmp_path):
    """The role's own template task renders the workspace site with the wildcard server and
    its certificate; nginx -t accepts the result."""
    crt, key = _self_signed(tmp_path, "all", "workspace.example.org")
    apps_crt, apps_key = _self_signed(tmp_path, "apps", APPS)
    prefix = tmp_path / "prefix"
    # nginx.conf for the prefix from the harness; the sites and snippets from the role.
    nginx.render(prefix, nginx.variables_for(443, {"workspace": "127.0.0.1:7000"}))
    for stale in (prefix / "sites").glob("*.conf"):
        stale.unlink()
    tasks = [
        role_task("nginx", "Render the sites from the repository's templates"),
        role_task("nginx", "Render the shared snippets from the repository's templates"),
    ]
    result = run_play(
        tmp_path,
        tasks,
        {
            "bundle_apps_host": APPS,
            "bundle_ports": PORTS,
            "base_services": ["workspace"],
            "nginx_templates_dir": str(ROOT / "nginx"),
            "nginx_sites_dir": str(prefix / "sites"),
            "nginx_snippets_dir": str(prefix / "snippets"),
            "nginx_cache_dir": str(prefix / "tmp/cache"),
            "nginx_listen_addresses": ["127.0.0.1"],
            "nginx_tls_certificate": str(crt),
            "nginx_tls_certificate_key": str(key),
            "nginx_apps_tls_certificate": str(apps_crt),
            "nginx_apps_tls_certificate_key": str(apps_key),
        },
        roles=("base", "nginx"),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    site = (prefix / "sites/bundle-workspace.conf").read_text()
    assert re.search(rf"^\s*server_name {re.escape(APPS)};$", site, re.M), site
    assert f"ssl_certificate {apps_crt};" in site and f"ssl_certificate_key {apps_key};" in site
    checked = nginx.test_config(prefix, check=False)
    assert checked.returncode == 0, checked.stderr


def test_the_owner_password_is_one_of_the_generated_secrets():
    defaults = yaml.safe_load((OPS / "roles/base/defaults/main.yml").read_text())
    assert defaults["base_secrets"]["workspace_owner_password"] == "token"
    services = yaml.safe_load((OPS / "roles/services/defaults/main.yml").read_text())
    assert services["services_workspace_owner_username"] == "admin"
    owner = yaml.safe_load((OPS / "roles/services/tasks/owner.yml").read_text())[0]
    # On standard input, never on the command line, and nothing of it in the play's output.
    assert owner["ansible.builtin.command"]["stdin"] == "{{ base_secret_values.workspace_owner_password }}"
    assert not any("password" in str(arg) for arg in owner["ansible.builtin.command"]["argv"])
    assert owner["no_log"] is True
