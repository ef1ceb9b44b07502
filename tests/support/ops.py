"""What the ops tests share: the venv's tools, Jinja2 as Ansible renders templates,
a role's own tasks run by ansible-playbook, TLS to a staging box by a site's name, and
the recap line of an ansible run."""

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import jinja2
import requests
import yaml

OPS = Path(__file__).resolve().parents[2] / "ops"
# The registry of the services (services.json), as group_vars/all.yml reads it from the
# checkout: a play written into a test's folder has no checkout above it, so it is given.
REGISTRY = json.loads((OPS.parent / "services.json").read_text())

VENV_BIN = Path(sys.executable).parent


def venv_tool(name):
    path = VENV_BIN / name
    assert path.exists(), f"{name} is missing from the venv: it comes with requirements-dev.txt"
    return str(path)


def ansible_like(search_path):
    """Jinja2 as Ansible's template module has it, with the filters the ops templates use."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(search_path)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters["to_json"] = json.dumps
    environment.filters["bool"] = _ansible_bool
    return environment


def _ansible_bool(value):
    """Ansible's `bool` filter: a YAML boolean as it is, a string by its word."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("yes", "on", "1", "true", "y", "t")


class ServerName(requests.adapters.HTTPAdapter):
    """TLS to 127.0.0.1 with a site's name as SNI (the box's names resolve nowhere)."""

    def __init__(self, host):
        self.server_name = host
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, server_hostname=self.server_name, **kwargs)


def site_session(name, base, verify=False):
    """requests to the site `name` (SNI and Host) at `base` (https://<address>, kept as
    `.base`): the staging boxes' names resolve nowhere. `verify`: a CA file, or False for
    the deployment's self-signed certificate."""
    http = requests.Session()
    http.verify = verify
    http.trust_env = False  # else REQUESTS_CA_BUNDLE from the environment overrides verify
    http.mount("https://", ServerName(name))
    http.headers["Host"] = name
    http.base = base
    return http


def recap(output):
    match = re.search(r"^localhost\s+:\s+(.*)$", output, re.M)
    assert match, output[-3000:]
    return dict(item.split("=") for item in match.group(1).split())


def role_task(role, name, tasks_file="main.yml"):
    """The task named `name` of ops/roles/<role>/tasks/<tasks_file>, as it is there, minus
    its handlers (nothing is reloaded by a test)."""
    tasks = yaml.safe_load((OPS / "roles" / role / "tasks" / tasks_file).read_text())
    task = next(t for t in tasks if t["name"] == name)
    return {k: v for k, v in task.items() if k != "notify"}


def registry_vars():
    """The settings group_vars/all.yml computes from the registry, with their values."""
    return {
        "bundle_registry": REGISTRY,
        "bundle_known_services": [s["name"] for s in REGISTRY],
        "bundle_ports": {s["name"]: s["port"] for s in REGISTRY},
        "bundle_workers": [s["name"] for s in REGISTRY if s["worker"]],
        "bundle_database_services": [s["name"] for s in REGISTRY if s["migrations"]],
        "bundle_redis_databases": {s["name"]: s["redis_db"] for s in REGISTRY if s["redis_db"] is not None},
    }


def group_vars():
    """group_vars/all.yml as a test reads it: the settings computed from the registry
    (registry_vars) with their values; the others as written."""
    return {**yaml.safe_load((OPS / "group_vars/all.yml").read_text()), **registry_vars()}


def run_play(folder, tasks, variables, roles=("base",)):
    """ansible-playbook (the venv's) on localhost with `tasks`, the settings of
    group_vars/all.yml, the defaults and the vars of `roles`, and `variables` (extra
    vars, which win); returns the completed process (text; ANSIBLE_NOCOLOR)."""
    folder = Path(folder)
    vars_files = [str(OPS / "group_vars/all.yml")] + [
        str(path)
        for role in roles
        for path in (OPS / "roles" / role / "defaults/main.yml", OPS / "roles" / role / "vars/main.yml")
        if path.exists()
    ]
    play = [
        {
            "name": "A role's tasks",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": vars_files,
            "tasks": list(tasks),
        }
    ]
    (folder / "play.yml").write_text(yaml.safe_dump(play))
    (folder / "vars.json").write_text(
        json.dumps({"ansible_python_interpreter": sys.executable, "bundle_registry": REGISTRY, **variables})
    )
    return subprocess.run(
        [venv_tool("ansible-playbook"), "-i", "localhost,", "-e", f"@{folder / 'vars.json'}", str(folder / "play.yml")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env={**os.environ, "ANSIBLE_LOCAL_TEMP": str(folder / "tmp"), "ANSIBLE_NOCOLOR": "1"},
    )


def in_parallel(function, names):
    """function(name) for each name, each in a thread of its own (staging boxes pulled at
    the same time); raises the first failure once every thread is done."""
    failures = []

    def run(name):
        try:
            function(name)
        except Exception as exc:  # raised below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
