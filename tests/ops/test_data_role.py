"""The data role (PostgreSQL and Redis for the services) and the services' DATABASE_URL
and REDIS_URL: its templates rendered and run by the real servers (Debian's PostgreSQL
and redis-server, in temporary folders), the role and database maker against a real
PostgreSQL, the environment files written by the services role's own tasks through
ansible-playbook. The role applied by ansible-pull on a staging box, reached over a
private network, is checked by tests/ops/test_two_hosts.py (its data host)."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from app import registry
from devtools.pg_server import PostgresServer
from devtools.services import free_port
from tests.support.ops import REGISTRY, ansible_like, group_vars, registry_vars, role_task, run_play, venv_tool

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
DATA = OPS / "roles/data"
SECRETS = OPS / "roles/base/files/bundle_secrets.py"
PG_ROLES = DATA / "files/bundle_pg_roles.py"
GROUP_VARS = group_vars()
DATA_DEFAULTS = yaml.safe_load((DATA / "defaults/main.yml").read_text())
DATABASE_SERVICES = GROUP_VARS["bundle_database_services"]


def _render(template, **variables):
    values = {
        **DATA_DEFAULTS,
        **{k: v for k, v in GROUP_VARS.items() if not k.startswith("bundle_ports")},
        "ansible_managed": "test",
        **variables,
    }
    return ansible_like(DATA / "templates").get_template(template).render(**values)


def _playbook_values(folder, names):
    """The values ansible-playbook gives the settings `names` from group_vars/all.yml and
    the services role's defaults, with the registry read as a checkout has it (services.json
    beside the playbook's folder)."""
    (folder / "ops").mkdir()
    (folder / "services.json").symlink_to(ROOT / "services.json")
    values = "{{ {" + ", ".join(f"'{name}': {name}" for name in names) + "} | to_json }}"
    play = [
        {
            "name": "Settings",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(OPS / "group_vars/all.yml"), str(OPS / "roles/services/defaults/main.yml")],
            "tasks": [
                {"ansible.builtin.copy": {"dest": str(folder / "values.json"), "mode": "0600", "content": values}}
            ],
        }
    ]
    (folder / "ops" / "play.yml").write_text(yaml.safe_dump(play))
    result = subprocess.run(
        [
            venv_tool("ansible-playbook"),
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(folder / "ops" / "play.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env={**os.environ, "ANSIBLE_LOCAL_TEMP": str(folder / "tmp"), "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return json.loads((folder / "values.json").read_text())


def _passwords():
    return {
        **{f"postgresql_{s}_password": f"pw-{s}-" + os.urandom(6).hex() for s in DATABASE_SERVICES},
        "redis_password": "redis-" + os.urandom(6).hex(),
    }


def _secret_values(passwords):
    """A secrets file's values for the services' environment files: placeholders and `passwords`."""
    return {
        "notebook_password": "nb",
        "notebook_encryption_key": "k",
        "workspace_oidc_client_secret": "o",
        "workspace_mesh_secret": "m",
        **passwords,
    }


# --------------------------------------------------------------------------- the playbook's settings


def test_the_playbook_settings_match_the_services(tmp_path):
    """Every service that reads DATABASE_URL gets a database; the playbook computes its
    lists of services from the registry (services.json) as app.registry reads it; the
    services that refuse several workers without Redis are the ones gunicorn.conf.py names."""
    readers = sorted(p.parent.name for p in (ROOT / "app").glob("*/settings.py") if "DATABASE_URL" in p.read_text())
    assert sorted(DATABASE_SERVICES) == readers
    assert set(GROUP_VARS["bundle_redis_databases"]) <= set(GROUP_VARS["bundle_known_services"])
    assert len(set(GROUP_VARS["bundle_redis_databases"].values())) == len(GROUP_VARS["bundle_redis_databases"])
    computed = _playbook_values(tmp_path, [*registry_vars(), "services_need_redis_to_scale"])
    assert computed == {
        **registry_vars(),
        "bundle_registry": REGISTRY,
        "services_need_redis_to_scale": [s.name for s in registry.SERVICES if s.needs_redis_to_scale],
    }
    assert computed["bundle_known_services"] == list(registry.NAMES)
    gunicorn = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy; print(sorted(runpy.run_path('gunicorn.conf.py')['NEEDS_REDIS_TO_SCALE']))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "SERVICE": "decks"},
        timeout=60,
        check=True,
    )
    assert gunicorn.stdout.strip() == repr(sorted(computed["services_need_redis_to_scale"]))
    assert GROUP_VARS["bundle_roles"] == ["services", "identity_provider", "nginx"]  # data: off by default
    assert GROUP_VARS["bundle_data_host"] == ""


# --------------------------------------------------------------------------- templates, real servers


def test_pg_hba_admits_each_service_to_its_own_database_with_scram_only():
    text = _render("pg_hba.conf.j2", data_allowed_networks=["127.0.0.1/32", "10.0.0.0/24"])
    rules = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert rules[0] == ["local", "all", "postgres", "peer"]
    exporter = ("host", "postgres", "bundle_monitoring", "127.0.0.1/32", "scram-sha-256")
    assert sorted(map(tuple, rules[1:])) == sorted(
        [
            *(
                ("host", f"bundle_{s}", f"bundle_{s}", network, "scram-sha-256")
                for s in DATABASE_SERVICES
                for network in ("127.0.0.1/32", "10.0.0.0/24")
            ),
            exporter,  # the monitoring role's postgres exporter, from loopback to `postgres` only
        ]
    )
    without = _render("pg_hba.conf.j2", monitoring_enabled=False)
    assert "bundle_monitoring" not in without
    settings = _render("postgresql.conf.j2", data_listen_addresses=["127.0.0.1", "10.0.0.5"])
    assert "password_encryption = 'scram-sha-256'" in settings.splitlines()
    assert "listen_addresses = '127.0.0.1,10.0.0.5'" in settings.splitlines()


def test_redis_config_has_the_password_and_the_append_only_file():
    text = _render(
        "redis.conf.j2",
        base_secret_values={"redis_password": "s3cret"},
        data_listen_addresses=["127.0.0.1", "10.0.0.5"],
    )
    lines = text.splitlines()
    for line in ("requirepass s3cret", "protected-mode yes", "appendonly yes", "bind 127.0.0.1 10.0.0.5", "port 6379"):
        assert line in lines, line


class ConfiguredPostgres(PostgresServer):
    """Debian's initdb in a temporary folder, started with the data role's rendered
    settings (included after postgresql.conf, as conf.d is) and pg_hba.conf, plus one
    trust line for the test's superuser connections."""

    def __init__(self, port, settings, hba):
        self.rendered_port, self.settings, self.hba = port, settings, hba
        super().__init__()

    def _options(self):
        return f"-k {self.root}"  # address and port: the rendered settings

    def start(self):
        self.port = self.rendered_port
        for name, text in (("bundle.conf", self.settings), ("pg_hba.conf", self.hba)):
            path = Path(self.data) / name
            path.write_text(text)
            if self.user:
                os.chown(path, *self.user)
        config = Path(self.data) / "postgresql.conf"
        if "include 'bundle.conf'" not in config.read_text():
            with config.open("a") as handle:
                handle.write("\ninclude 'bundle.conf'\nfsync = off\n")
        super().start()


@pytest.fixture
def configured_postgres():
    port = free_port()
    settings = _render("postgresql.conf.j2", bundle_postgresql_port=port)
    hba = _render("pg_hba.conf.j2", data_postgresql_hba_extra=["host all postgres 127.0.0.1/32 trust"])
    server = ConfiguredPostgres(port, settings, hba)
    try:
        yield server
    finally:
        server.close()


def _pg_roles(server, secrets_file):
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGUSER": "postgres"}
    result = subprocess.run(
        [
            sys.executable,
            str(PG_ROLES),
            str(secrets_file),
            "--port",
            str(server.port),
            *[f"bundle_{s}=postgresql_{s}_password" for s in DATABASE_SERVICES],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _login(server, service, password, database=None):
    return psycopg.connect(
        host="127.0.0.1",
        port=server.port,
        user=f"bundle_{service}",
        password=password,
        dbname=database or f"bundle_{service}",
        connect_timeout=10,
    )


def test_roles_and_databases_log_in_with_scram_and_nowhere_else(configured_postgres, tmp_path):
    server, secrets_file = configured_postgres, tmp_path / "secrets.json"
    passwords = _passwords()
    secrets_file.write_text(json.dumps(passwords))
    assert _pg_roles(server, secrets_file) == "changed\n"
    assert _pg_roles(server, secrets_file) == ""  # a re-run changes nothing
    for service in DATABASE_SERVICES:
        with _login(server, service, passwords[f"postgresql_{service}_password"]) as conn:
            conn.execute("CREATE TABLE t (x int)")  # the owner may make its tables
            assert conn.execute("SHOW password_encryption").fetchone()[0] == "scram-sha-256"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _login(server, "wizard", "wrong")
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):
        _login(server, "wizard", passwords["postgresql_wizard_password"], database="bundle_notebook")
    with pytest.raises(psycopg.OperationalError, match="no pg_hba.conf entry"):
        _login(server, "wizard", passwords["postgresql_wizard_password"], database="postgres")
    with psycopg.connect(server.url(), autocommit=True) as conn:
        stored = dict(conn.execute("SELECT rolname, rolpassword FROM pg_authid WHERE rolname LIKE 'bundle_%'"))
        assert set(stored) == {f"bundle_{s}" for s in DATABASE_SERVICES}
        assert all(value.startswith("SCRAM-SHA-256$4096:") for value in stored.values())
        # A verifier PostgreSQL made itself from the same password is taken as current.
        conn.execute(f"ALTER ROLE bundle_notebook PASSWORD '{passwords['postgresql_notebook_password']}'")
    assert _pg_roles(server, secrets_file) == ""
    # A changed secret: the role follows it, the old password no longer opens.
    old = passwords["postgresql_wizard_password"]
    passwords["postgresql_wizard_password"] = "new-" + os.urandom(8).hex()
    secrets_file.write_text(json.dumps(passwords))
    assert _pg_roles(server, secrets_file) == "changed\n"
    _login(server, "wizard", passwords["postgresql_wizard_password"]).close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _login(server, "wizard", old)


def test_the_postgres_exporters_role_reads_statistics_and_has_no_database(configured_postgres, tmp_path):
    """--monitor (the monitoring role): a login role of pg_monitor, the same password
    logic as the services' roles, no database of its own."""
    server, secrets_file = configured_postgres, tmp_path / "secrets.json"
    password = "mon-" + os.urandom(8).hex()
    secrets_file.write_text(json.dumps({"postgresql_monitoring_password": password}))
    argv = [sys.executable, str(PG_ROLES), str(secrets_file), "--port", str(server.port), "--monitor"]
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGUSER": "postgres"}

    def run():
        done = subprocess.run(
            [*argv, "bundle_monitoring=postgresql_monitoring_password"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run() == "changed\n"
    assert run() == ""
    with psycopg.connect(
        host="127.0.0.1", port=server.port, user="bundle_monitoring", password=password, dbname="postgres"
    ) as conn:
        assert conn.execute("SELECT pg_has_role('pg_monitor', 'MEMBER')").fetchone()[0] is True
    with psycopg.connect(server.url(), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = 'bundle_monitoring'").fetchone()[0] == 0
        conn.execute("REVOKE pg_monitor FROM bundle_monitoring")
    assert run() == "changed\n"  # membership restored


@pytest.mark.parametrize("monitoring", [True, False])
def test_the_base_role_makes_the_exporters_password_on_a_data_host_with_monitoring(tmp_path, monitoring):
    """postgresql_monitoring_password is one of the base role's secrets where the data role
    runs with monitoring on (the monitoring role reads it from base_secret_values)."""
    task = role_task("base", "Generate the missing secrets (kept across runs, never printed)")
    secrets_file = tmp_path / "secrets.json"
    variables = {
        "bundle_roles": ["data"],
        "monitoring_enabled": monitoring,
        "base_secrets_file": str(secrets_file),
        "role_path": str(OPS / "roles/base"),
    }
    played = run_play(tmp_path, [task], variables)
    assert played.returncode == 0, played.stdout[-3000:]
    stored = json.loads(secrets_file.read_text())
    assert "redis_password" in stored
    assert ("postgresql_monitoring_password" in stored) is monitoring


def test_the_role_maker_never_puts_a_password_on_a_command_line(tmp_path):
    """It runs psql with the SQL on stdin; a failure names the error, not the verifier."""
    secrets_file = tmp_path / "secrets.json"
    secrets_file.write_text(json.dumps({"postgresql_wizard_password": "topsecret"}))
    result = subprocess.run(
        [
            sys.executable,
            str(PG_ROLES),
            str(secrets_file),
            "--port",
            str(free_port()),
            "bundle_wizard=postgresql_wizard_password",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PGHOST": "127.0.0.1", "PGCONNECT_TIMEOUT": "2"},
    )
    assert result.returncode != 0 and "psql failed" in result.stderr
    assert "topsecret" not in result.stderr + result.stdout
    source = PG_ROLES.read_text()
    assert "input=sql" in source and "-c" not in re.findall(r'"(-\w)"', source)


def _redis_cli(port, *args, password=None):
    auth = ["-a", password, "--no-auth-warning"] if password else []
    return subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *auth, *args], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def test_the_rendered_redis_config_refuses_clients_without_the_password(tmp_path):
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is missing (apt-get install redis-server)")
    port, password = free_port(), "redis-" + os.urandom(8).hex()
    config = tmp_path / "redis.conf"
    config.write_text(_render("redis.conf.j2", bundle_redis_port=port, base_secret_values={"redis_password": password}))
    # Only the paths differ from the data host's (its /var/lib/redis, /run/redis).
    process = subprocess.Popen(
        [
            "redis-server",
            str(config),
            "--dir",
            str(tmp_path),
            "--pidfile",
            str(tmp_path / "redis.pid"),
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while _redis_cli(port, "ping", password=password) != "PONG":
            assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)  # polling for the server to listen, with a deadline
        assert "NOAUTH" in _redis_cli(port, "ping")
        assert "NOAUTH" in _redis_cli(port, "get", "x")
        assert "NOAUTH" in _redis_cli(port, "ping", password="wrong")  # AUTH refused, so is the rest
        assert _redis_cli(port, "config", "get", "appendonly", password=password).split() == ["appendonly", "yes"]
        assert _redis_cli(port, "config", "get", "protected-mode", password=password).split()[1] == "yes"
        assert _redis_cli(port, "-n", "3", "set", "k", "v", password=password) == "OK"
        assert (tmp_path / "appendonlydir").is_dir()
    finally:
        process.terminate()
        process.wait(30)


# --------------------------------------------------------------------------- environment files


def _env_task():
    """The services role's own task that writes the environment files, as it is in
    tasks/main.yml, minus its handler (nothing is restarted here)."""
    tasks = yaml.safe_load((OPS / "roles/services/tasks/main.yml").read_text())
    task = next(t for t in tasks if t["name"] == "Write each service's environment file")
    task = {k: v for k, v in task.items() if k not in ("notify", "no_log")}
    task["ansible.builtin.template"]["src"] = str(OPS / "roles/services/templates/service.env.j2")
    return task


def _write_env_files(tmp_path, **variables):
    """ansible-playbook with the services role's data_urls.yml and env file task, into
    tmp_path/etc; returns (result, {service: {KEY: value}})."""
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    playbook = [
        {
            "name": "Environment files",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [
                str(OPS / "group_vars/all.yml"),
                str(OPS / "roles/services/defaults/main.yml"),
                str(OPS / "roles/services/vars/main.yml"),
                str(OPS / "roles/base/defaults/main.yml"),
            ],
            "tasks": [{"ansible.builtin.import_tasks": str(OPS / "roles/services/tasks/data_urls.yml")}, _env_task()],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook))
    settings = {
        "bundle_config_dir": str(etc),
        "bundle_user": "root",
        "bundle_registry": REGISTRY,
        "bundle_ports": {s: 7000 + i for i, s in enumerate(GROUP_VARS["bundle_known_services"])},
        "base_services": GROUP_VARS["bundle_known_services"],
        "ansible_python_interpreter": sys.executable,
        "base_secret_values": {
            "notebook_password": "nb",
            "notebook_encryption_key": "key",
            "workspace_oidc_client_secret": "oidc",
        },
        **variables,
    }
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    result = subprocess.run(
        [
            venv_tool("ansible-playbook"),
            "-i",
            "localhost,",
            "-e",
            f"@{tmp_path / 'vars.json'}",
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"},
    )
    files = {}
    for path in sorted(etc.glob("*.env")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        files[path.stem] = dict(
            re.match(r'^(\w+)="(.*)"$', line).groups()
            for line in path.read_text().splitlines()
            if line and not line.startswith("#")
        )
    return result, files


def test_env_files_without_a_data_host_keep_the_embedded_defaults(tmp_path):
    result, files = _write_env_files(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert sorted(files) == sorted(GROUP_VARS["bundle_known_services"])
    for values in files.values():
        assert "DATABASE_URL" not in values and "REDIS_URL" not in values


def test_env_files_with_a_data_host_get_their_urls(tmp_path):
    passwords = _passwords()
    result, files = _write_env_files(
        tmp_path,
        bundle_data_host="10.0.0.5",
        bundle_postgresql_port=5433,
        services_web_concurrency=4,
        base_secret_values={
            "notebook_password": "nb",
            "notebook_encryption_key": "key",
            "workspace_oidc_client_secret": "oidc",
            "workspace_mesh_secret": "mesh",
            **passwords,
        },
        services_database_url={"notebook": "postgresql://nb:pw@db.internal:5432/notebook"},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    for secret in passwords.values():
        assert secret not in result.stdout + result.stderr
    assert files["wizard"]["DATABASE_URL"] == (
        f"postgresql://bundle_wizard:{passwords['postgresql_wizard_password']}@10.0.0.5:5433/bundle_wizard"
    )
    assert files["workspace"]["DATABASE_URL"].endswith("@10.0.0.5:5433/bundle_workspace")
    assert files["notebook"]["DATABASE_URL"] == "postgresql://nb:pw@db.internal:5432/notebook"
    assert "DATABASE_URL" not in files["audio"] and "DATABASE_URL" not in files["decks"]
    redis = {s: files[s].get("REDIS_URL") for s in files}
    assert redis == {
        "decks": None,
        **{
            s: f"redis://:{passwords['redis_password']}@10.0.0.5:6379/{n}"
            for s, n in GROUP_VARS["bundle_redis_databases"].items()
        },
    }
    assert {values["WEB_CONCURRENCY"] for values in files.values()} == {"4"}
    assert files["workspace"]["WORKSPACE_MESH_SECRET"] == "mesh" and "WORKSPACE_MESH_ADDRESS" not in files["workspace"]


def test_env_files_are_not_written_without_the_data_hosts_passwords(tmp_path):
    result, files = _write_env_files(tmp_path, bundle_data_host="fd00::5")
    assert result.returncode != 0 and not files
    assert "has no postgresql_workspace_password, postgresql_notebook_password" in result.stdout
    assert "copy them from the data host" in result.stdout


def test_several_workers_without_redis_stop_the_play(tmp_path):
    result, files = _write_env_files(tmp_path, services_web_concurrency=2)
    assert result.returncode != 0 and not files
    assert "but workspace, wizard would have no REDIS_URL" in result.stdout


def test_an_ipv6_data_host_is_bracketed_in_the_urls(tmp_path):
    passwords = _passwords()
    result, files = _write_env_files(
        tmp_path,
        bundle_data_host="fd00::5",
        base_secret_values=_secret_values(passwords),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert files["audio"]["REDIS_URL"].endswith("@[fd00::5]:6379/2")


def test_env_files_with_the_ha_tier_name_every_host_and_the_sentinels(tmp_path):
    passwords = _passwords()
    result, files = _write_env_files(
        tmp_path,
        bundle_data_hosts=["10.0.0.5", "10.0.0.6", "fd00::7"],
        services_web_concurrency=2,
        base_secret_values=_secret_values(passwords),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert files["wizard"]["DATABASE_URL"] == (
        f"postgresql://bundle_wizard:{passwords['postgresql_wizard_password']}"
        "@10.0.0.5:5432,10.0.0.6:5432,[fd00::7]:5432/bundle_wizard?target_session_attrs=read-write"
    )
    for service, number in GROUP_VARS["bundle_redis_databases"].items():
        assert files[service]["REDIS_URL"] == (
            f"redis+sentinel://:{passwords['redis_password']}@10.0.0.5:26379,10.0.0.6:26379,[fd00::7]:26379/bundle/{number}"
        )


def test_secrets_import_takes_the_named_entries_of_another_host(tmp_path):
    data_host, app_host = tmp_path / "data.json", tmp_path / "app.json"
    specs = [*[f"postgresql_{s}_password=token" for s in DATABASE_SERVICES], "redis_password=token", "x=token"]
    subprocess.run([sys.executable, str(SECRETS), str(data_host), "ensure", *specs], check=True, timeout=60)
    subprocess.run(
        [sys.executable, str(SECRETS), str(app_host), "ensure", "notebook_password=token"], check=True, timeout=60
    )
    before = json.loads(app_host.read_text())

    def run(*patterns):
        return subprocess.run(
            [sys.executable, str(SECRETS), str(app_host), "import", *patterns],
            input=data_host.read_text(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("postgresql_*", "redis_password").stdout == "changed\n"
    theirs, mine = json.loads(data_host.read_text()), json.loads(app_host.read_text())
    assert mine == {**before, **{k: v for k, v in theirs.items() if k != "x"}}
    assert stat.S_IMODE(app_host.stat().st_mode) == 0o600
    assert run("postgresql_*", "redis_password").stdout == ""  # the same again: nothing written
    missing = run("nothing_*")
    assert missing.returncode != 0 and "nothing named 'nothing_*'" in missing.stderr
    assert json.loads(app_host.read_text()) == mine
