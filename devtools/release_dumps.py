"""The databases of a release, filled through its public API, as SQL dumps that the
upgrade tests load (tests/migrations/):

    .venv/bin/python -m devtools.release_dumps v0.1.0 [--keep]

1. A git worktree of the tag in a temporary directory, its `.venv` a symlink to this
   checkout's (the release's code on the same packages); removed at the end.
2. The release's `workspace`, `wizard` and `notebook` services started from that
   worktree as production starts them (`gunicorn -c gunicorn.conf.py wsgi:app`, cwd the
   worktree), each on a fresh DATA_DIR, with the notebook's job worker
   (`python -m app.notebook worker`) from the worktree too.
3. Each one filled through its HTTP API with a small, varied data set that touches
   every table of its MODELS (what needs a model provider is answered by the local
   stand-ins the tests use: devtools.fake_providers for the wizard and the notebook;
   the workspace's single sign-on goes through devtools.oidc_provider, and a real
   agent process of the release connects once).
4. The services and the worker stopped with SIGTERM, then each database written as
   plain SQL to tests/migrations/<TAG>/<service>.sql and checked: it loads into an
   empty file with `executescript`, every table (and the full-text index, which still
   answers MATCH) holds the same rows, and dumping the loaded copy gives the same text.
5. tests/migrations/<TAG>/fixtures.json: what the upgrade test checks (ids, names,
   counts, the API's views of the rows, and the throwaway test secrets: passwords,
   session tokens, the notebook's encryption key, the identities used).

The dump is `sqlite3`'s iterdump made deterministic (tables and rows in a fixed order)
and able to carry FTS5 tables: iterdump writes a virtual table into sqlite_master with
`PRAGMA writable_schema` and copies its shadow tables as plain tables, which a
defensive SQLite refuses and which ties the copy to FTS5's on-disk format. Here a
virtual table is written as its CREATE statement, its configuration (`rank`, …) and
its rows inserted through the table itself; its shadow tables are left out.

Not app code, and not the current code: nothing from app/ is imported here.
"""

import argparse
import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urljoin

import requests

from devtools import services
from devtools.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "migrations"
SERVICES = ("workspace", "wizard", "notebook")
DB_FILES = {"workspace": "workspace.db", "wizard": "wizard.db", "notebook": "notebook.db"}
TIMEOUT = 60
JOB_DEADLINE = 120.0
STOP_TIMEOUT = 20.0
# Variables of the services and their providers that must not leak in from the caller.
_SCRUBBED_PREFIXES = ("WORKSPACE_", "NOTEBOOK_", "WIZ_", "OPENAI_", "ANTHROPIC_", "OLLAMA_", "FREESOUND_", "AUDIO_")
_SCRUBBED = {"DATABASE_URL", "PYTHONPATH", "SERVICE", "PORT", "HOST", "DATA_DIR", "WEB_CONCURRENCY", "SOUNDLIB_DIR"}


def log(message):
    print(f"[release_dumps] {message}", file=sys.stderr, flush=True)


# =========================================================================== the release's processes


class Release:
    """A worktree of the release, and the processes started from it."""

    def __init__(self, tree, scratch):
        self.tree, self.scratch = Path(tree), Path(scratch)
        self.processes = []

    @property
    def python(self):
        return str(self.tree / ".venv" / "bin" / "python")

    def env(self, extra=None):
        base = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIXES)}
        return {**base, "PYTHONPATH": str(self.tree), **(extra or {})}

    def check_code(self):
        """The worktree's `app` is the one its processes import (not this checkout's)."""
        found = subprocess.run(
            [self.python, "-c", "import app, wsgi; print(app.__file__); print(wsgi.__file__)"],
            cwd=self.tree,
            env=self.env({"SERVICE": "decks"}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        paths = found.stdout.split()
        if found.returncode != 0 or len(paths) != 2 or not all(Path(p).is_relative_to(self.tree) for p in paths):
            raise RuntimeError(f"the release's code is not what its processes import: {found.stdout}{found.stderr}")

    def spawn(self, name, argv, env):
        log_path = self.scratch / f"{name}.log"
        with open(log_path, "ab") as output:
            process = subprocess.Popen(argv, cwd=self.tree, env=self.env(env), stdout=output, stderr=subprocess.STDOUT)
        process.log_path = log_path
        self.processes.append(process)
        return process

    def start_service(self, name, data_dir, env=None, port=None):
        """`SERVICE=<name> … gunicorn -c gunicorn.conf.py wsgi:app` in the worktree; waits for health."""
        port = port or services.free_port()
        environment = {
            "SERVICE": name,
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "DATA_DIR": str(data_dir),
            "WEB_CONCURRENCY": "1",
            **(env or {}),
        }
        process = self.spawn(
            name, [str(self.tree / ".venv" / "bin" / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"], environment
        )
        service = services.RunningService(name, port, data_dir, process)
        try:
            services.wait_healthy(
                service.base_url + services.HEALTH_PATHS.get(name, "/healthz"), timeout=60, process=process
            )
        except BaseException:
            self.stop(process)
            raise RuntimeError(f"the release's {name} did not start:\n{tail(process.log_path)}") from None
        return service

    def start_worker(self, data_dir, env):
        return self.spawn(
            "notebook-worker", [self.python, "-m", "app.notebook", "worker"], {"DATA_DIR": str(data_dir), **env}
        )

    def stop(self, process):
        """SIGTERM, then wait (graceful); killed past STOP_TIMEOUT, which is an error."""
        try:
            services.terminate(process, STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{process.args} did not stop within {STOP_TIMEOUT} s") from None
        if process in self.processes:
            self.processes.remove(process)
        return process.returncode

    def stop_all(self):
        for process in list(self.processes):
            try:
                self.stop(process)
            except RuntimeError as exc:
                log(str(exc))


def _stopped(release, process):
    """Stop a service gracefully; an exit status other than 0 is an error."""
    code = release.stop(process)
    if code != 0:
        raise RuntimeError(f"{process.args} ended with {code}:\n{tail(process.log_path)}")


def tail(path, size=4000):
    try:
        return Path(path).read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"


class Api:
    """Calls to a running service with fixed headers; an unexpected status is an error."""

    def __init__(self, base_url, headers=None):
        self.base_url, self.headers = base_url, dict(headers or {})

    def __call__(self, method, path, expect=(200, 201), headers=None, **kwargs):
        kwargs.setdefault("timeout", TIMEOUT)
        response = requests.request(method, self.base_url + path, headers={**self.headers, **(headers or {})}, **kwargs)
        if response.status_code not in (expect if isinstance(expect, tuple) else (expect,)):
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:1000]}")
        return response

    def json(self, method, path, **kwargs):
        return self(method, path, **kwargs).json()


# =========================================================================== workspace

WORKSPACE_OIDC_PASSWORD = "idp-pass-release-dumps"
WORKSPACE_OIDC_CLIENT = "workspace"
WORKSPACE_OIDC_SECRET = "release-dumps-oidc-client-secret"  # known only as a digest to the provider
WORKSPACE_USERS = {
    "owner": {
        "email": "owner@example.com",
        "username": "owner",
        "name": "Olive Owner",
        "password": "correct horse battery",
    },
    "member": {
        "email": "member@example.com",
        "username": "member",
        "name": "Max Member",
        "password": "second good passphrase",
        "login_type": "password",
    },
    "robot": {"email": "robot@example.com", "username": "robot", "name": "Build Robot", "login_type": "none"},
}
WORKSPACE_PROVIDER_USERS = [
    # Signs in first with SSO: a new `oidc` account.
    {
        "username": "dave",
        "email": "dave@example.net",
        "email_verified": True,
        "name": "Dave Dev",
        "groups": ["developers"],
    },
    # The Owner's email, verified: links the provider account to the Owner.
    {"username": "olivia", "email": "Owner@Example.COM", "email_verified": True, "name": "Olivia Owner"},
]


def fill_workspace(release, data_dir):
    from devtools.oidc_provider import OidcProvider, pbkdf2_sha512_digest, sign_in

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the provider's request lines
    port = services.free_port()
    base_url = f"http://127.0.0.1:{port}"
    callback = "/api/v2/users/oidc/callback"
    idp = OidcProvider(
        {
            "clients": [
                {
                    "client_id": WORKSPACE_OIDC_CLIENT,
                    "client_name": "Workspace",
                    "client_secret_digest": pbkdf2_sha512_digest(WORKSPACE_OIDC_SECRET, rounds=1000),
                    "redirect_uris": [base_url + callback],
                }
            ],
            "users": [{**user, "password": WORKSPACE_OIDC_PASSWORD} for user in WORKSPACE_PROVIDER_USERS],
        }
    ).start()
    env = {
        "WORKSPACE_ACCESS_URL": base_url,
        "WORKSPACE_AGENT_PING_SECONDS": "1",
        "WORKSPACE_OIDC_ISSUER_URL": idp.issuer,
        "WORKSPACE_OIDC_CLIENT_ID": WORKSPACE_OIDC_CLIENT,
        "WORKSPACE_OIDC_CLIENT_SECRET": WORKSPACE_OIDC_SECRET,
    }
    try:
        service = release.start_service("workspace", data_dir, env, port=port)
        try:
            fixtures = _workspace_data(release, service, idp, callback, sign_in)
        finally:
            _stopped(release, service.process)
    finally:
        idp.stop()
    fixtures["settings"] = {"WORKSPACE_AGENT_PING_SECONDS": "1"}
    return fixtures


def _workspace_data(release, service, idp, callback, sign_in):
    api = Api(service.base_url + "/api/v2")
    header = "Workspace-Session-Token"

    def as_user(token):
        return Api(service.base_url + "/api/v2", {header: token})

    api("GET", "/users/first", expect=404)
    owner_spec = WORKSPACE_USERS["owner"]
    first = api.json("POST", "/users/first", json={k: owner_spec[k] for k in ("email", "username", "name", "password")})
    owner = as_user(first["session_token"])
    users = {"owner": {**owner_spec, "id": first["user_id"], "login_type": "password"}}
    tokens = {"owner_first": {"user": "owner", "token": first["session_token"], "revoked": False}}
    for key in ("member", "robot"):
        created = owner.json("POST", "/users", json=WORKSPACE_USERS[key])
        users[key] = {**WORKSPACE_USERS[key], "id": created["id"]}

    def login(key):
        spec = WORKSPACE_USERS[key]
        return api.json("POST", "/users/login", json={"email": spec["email"], "password": spec["password"]})

    tokens["member_login"] = {"user": "member", "token": login("member")["session_token"], "revoked": False}
    signed_out = login("owner")["session_token"]
    as_user(signed_out)("POST", "/users/logout")
    tokens["owner_signed_out"] = {"user": "owner", "token": signed_out, "revoked": True}
    api("POST", "/users/login", expect=401, json={"email": users["member"]["email"], "password": "not the password"})

    # Single sign-on: dave gets a new account, olivia links to the Owner (same email).
    for provider_user, key, token_name in (("dave", "dave", "dave_sso"), ("olivia", "owner", "owner_sso")):
        http = requests.Session()
        start = http.get(service.base_url + callback, timeout=TIMEOUT, allow_redirects=False)
        if start.status_code not in (302, 303):
            raise RuntimeError(f"SSO start: {start.status_code} {start.text[:300]}")
        location = sign_in(http, start.headers["Location"], provider_user, WORKSPACE_OIDC_PASSWORD)
        finished = http.get(urljoin(service.base_url, location), timeout=TIMEOUT, allow_redirects=False)
        token = http.cookies.get("workspace_session_token")
        http.close()
        if finished.status_code != 303 or not token:
            raise RuntimeError(f"SSO as {provider_user}: {finished.status_code} {finished.text[:300]}")
        tokens[token_name] = {"user": key, "token": token, "revoked": False}
        if key == "dave":
            me = as_user(token).json("GET", "/users/me")
            spec = next(u for u in WORKSPACE_PROVIDER_USERS if u["username"] == provider_user)
            users["dave"] = {
                "id": me["id"],
                "username": me["username"],
                "email": me["email"],
                "name": me["name"],
                "login_type": "oidc",
                "provider_username": provider_user,
                "groups": spec["groups"],
            }
    users["owner"]["provider_username"] = "olivia"

    # Workspaces: the Owner's `dev` (agents main with two apps, gpu with none) and
    # `lab`, made by the Owner for member.
    dev = owner.json(
        "POST",
        "/users/me/workspaces",
        json={
            "name": "dev",
            "agents": [
                {
                    "name": "main",
                    "apps": [
                        {"slug": "code", "url": "http://127.0.0.1:8080"},
                        {
                            "slug": "docs",
                            "display_name": "Project docs",
                            "url": "http://127.0.0.1:3000/",
                            "sharing_level": "authenticated",
                        },
                    ],
                },
                {"name": "gpu", "apps": []},
            ],
        },
    )
    lab = owner.json(
        "POST",
        "/users/member/workspaces",
        json={
            "name": "lab",
            "agents": [
                {
                    "name": "box",
                    "apps": [{"slug": "notebook", "url": "http://127.0.0.1:8888", "sharing_level": "authenticated"}],
                }
            ],
        },
    )
    agent_tokens = {f"dev.{a['name']}": a["token"] for a in dev["agents"]}
    agent_tokens["lab.box"] = lab["agents"][0]["token"]
    gpu = next(a for a in dev["agents"] if a["name"] == "gpu")
    agent_tokens["dev.gpu"] = owner.json("POST", f"/workspaceagents/{gpu['id']}/token")["token"]

    # The release's own agent program connects `dev.main` once (connection timestamps,
    # and an app it reports that was not declared), then stops.
    main = next(a for a in dev["agents"] if a["name"] == "main")
    agent = release.spawn(
        "workspace-agent",
        [
            release.python,
            "-m",
            "app.workspace.agent",
            "--url",
            service.base_url,
            "--app",
            "code=http://127.0.0.1:8080",
            "--app",
            "metrics=http://127.0.0.1:9100",
        ],
        {"WORKSPACE_AGENT_TOKEN": agent_tokens["dev.main"], "SHELL": "/bin/sh"},
    )

    def status(wanted):
        return owner.json("GET", f"/workspaceagents/{main['id']}")["status"] == wanted

    try:
        wait_for(lambda: status("connected"), "the release's agent connects", timeout=60)
        wait_for(
            lambda: len(owner.json("GET", f"/workspaceagents/{main['id']}")["apps"]) == 3,
            "the agent reports its apps",
            timeout=30,
        )
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n{tail(agent.log_path)}") from None
    finally:
        release.stop(agent)
    wait_for(lambda: status("disconnected"), "the agent shows disconnected", timeout=60)

    for entry in tokens.values():
        expected = 401 if entry["revoked"] else 200
        as_user(entry["token"])("GET", "/users/me", expect=expected)
    views = {
        "users": {
            key: as_user(tokens[name]["token"]).json("GET", "/users/me")
            for key, name in (("owner", "owner_first"), ("member", "member_login"), ("dave", "dave_sso"))
        },
        "workspaces": {w["name"]: owner.json("GET", f"/workspaces/{w['id']}") for w in (dev, lab)},
    }
    return {
        "users": users,
        "tokens": tokens,
        "agent_tokens": agent_tokens,
        "oidc": {
            "issuer": idp.issuer,
            "client_id": WORKSPACE_OIDC_CLIENT,
            "client_secret": WORKSPACE_OIDC_SECRET,
            "password": WORKSPACE_OIDC_PASSWORD,
            "users": WORKSPACE_PROVIDER_USERS,
            "linked": {"dave": "dave", "olivia": "owner"},
        },
        "workspaces": {
            "dev": {"id": dev["id"], "owner": "owner", "agents": {a["name"]: a["id"] for a in dev["agents"]}},
            "lab": {"id": lab["id"], "owner": "member", "agents": {a["name"]: a["id"] for a in lab["agents"]}},
        },
        "reported_app": {"agent": "dev.main", "slug": "metrics", "url": "http://127.0.0.1:9100"},
        "views": views,
    }


# =========================================================================== wizard

WIZARD_IDENTITIES = {"alice": "", "bob": "users", "root": "users,admins", "public": ""}
WIZARD_AI_KEY = "wizard-release-dumps-key"


def fill_wizard(release, data_dir):
    from devtools.fake_providers import FakeProviders

    with FakeProviders(host="127.0.0.1", keys={"openai": WIZARD_AI_KEY}) as fake:
        env = {
            "WIZ_ALLOW_TEST_IDENTITY": "1",
            "WIZ_AI_BASE_URL": fake.base_url(),
            "WIZ_AI_API_KEY": WIZARD_AI_KEY,
            "WIZ_TEXT_MODEL": "fake-valid-json",
            "WIZ_IMAGE_MODEL": "fake-webp",
            "WIZ_AI_TIMEOUT": "30",
        }
        service = release.start_service("wizard", data_dir, env)
        try:
            fixtures = _wizard_data(service)
        finally:
            _stopped(release, service.process)
    return fixtures


def _wizard_data(service):
    def who(user):
        return Api(service.base_url, {"X-Wiz-Test-User": user, "X-Wiz-Test-Groups": WIZARD_IDENTITIES[user]})

    alice, bob, root, public = who("alice"), who("bob"), who("root"), who("public")

    def create(client, collection, payload):
        return client.json("POST", f"/api/collections/{collection}", json=payload)

    # The global wizards the release seeded: one edited, one deleted by an administrator.
    seeded = root.json("GET", "/api/collections/wizards")
    globals_ = sorted((row for row in seeded if row.get("user_id") is None), key=lambda row: row["name"])
    edited, deleted = globals_[0], globals_[-1]
    root.json(
        "PATCH",
        f"/api/collections/wizards/{edited['id']}",
        json={"description": "Edited by an administrator before the upgrade."},
    )
    root("DELETE", f"/api/collections/wizards/{deleted['id']}", expect=204)

    steps = [
        {"id": "subject", "label": "Subject", "question": "What is in the picture?", "kind": "text"},
        {"id": "mood", "label": "Mood", "question": "Which mood?", "kind": "choice", "options": ["calm", "stormy"]},
    ]
    wizards = {
        "alice_private": create(
            alice,
            "wizards",
            {
                "name": "Alice's portraits",
                "category": "images",
                "is_public": False,
                "steps": steps,
                "template": "A portrait of {subject}, {mood} light.",
            },
        ),
        "bob_public": create(
            bob,
            "wizards",
            {
                "name": "Bob's harbours",
                "category": "images",
                "is_public": True,
                "steps": steps[:1],
                "template": "A harbour with {subject}.",
            },
        ),
    }
    blueprints = {
        "foggy": create(
            alice,
            "blueprints",
            {
                "title": "Foggy harbour",
                "prompt": 'A foggy harbour at dawn, "muted" colours — ünïcode too',
                "is_public": True,
                "key": "foggy-harbour",
                "tags": ["sea", "fog"],
            },
        ),
        "lamp": create(
            bob, "blueprints", {"title": "Desk lamp", "prompt": "A brass desk lamp\non oak.", "is_public": False}
        ),
        "market": create(
            alice, "blueprints", {"title": "Night market", "prompt": "Lanterns over a night market.", "is_public": True}
        ),
    }
    likes = []
    for client, key in ((alice, "foggy"), (bob, "foggy"), (bob, "lamp"), (bob, "market"), (bob, "market")):
        likes.append(client.json("POST", "/api/likes/toggle", json={"blueprint_id": blueprints[key]["id"]}))
    if [like["likes_count"] for like in likes] != [1, 2, 1, 1, 0]:
        raise RuntimeError(f"unexpected like counts: {likes}")
    history = [
        create(
            alice,
            "prompt_history",
            {
                "prompt": "A foggy harbour at dawn",
                "blueprint_id": blueprints["foggy"]["id"],
                "wizard_id": wizards["alice_private"]["id"],
            },
        ),
        create(alice, "prompt_history", {"prompt": "A lighthouse in fog", "answers": {"subject": "lighthouse"}}),
        create(bob, "prompt_history", {"prompt": "A brass lamp", "blueprint_id": blueprints["lamp"]["id"]}),
    ]
    saved = [
        create(alice, "saved_prompts", {"title": "Harbour", "prompt": "A foggy harbour", "key": "harbour"}),
        create(bob, "saved_prompts", {"title": "Lamp", "prompt": "A brass lamp on oak"}),
        create(public, "saved_prompts", {"title": "Anonymous", "prompt": "Saved without signing in"}),
    ]
    admin_prompts = [
        create(root, "admin_prompts", {"key": "ideas.system", "text": "You suggest picture ideas."}),
        create(root, "admin_prompts", {"key": "image.system", "text": "Photorealistic, natural light."}),
    ]
    # llm_logs: one written by an administrator, two by AI calls (the local stand-in
    # provider answering); llm_timings: the JSON call that worked and one that failed.
    manual_log = create(root, "llm_logs", {"type": "note", "kind": "manual", "content": "Written by an admin."})
    alice.json(
        "POST",
        "/api/ai/text",
        json={
            "messages": [{"role": "user", "content": "Five ideas for a harbour picture"}],
            "json": True,
            "kind": "ideas",
            "templateKey": "ideas.harbour",
            "model": "fake-ideas-5",
            "system": "You suggest picture ideas.",
        },
    )
    bob.json(
        "POST",
        "/api/ai/text",
        json={"messages": [{"role": "user", "content": "Say hello"}], "model": "fake-text", "kind": "greeting"},
    )
    bob(
        "POST",
        "/api/ai/text",
        expect=502,
        json={
            "messages": [{"role": "user", "content": "JSON please"}],
            "json": True,
            "kind": "ideas",
            "model": "fake-invalid-twice",
        },
    )

    views = {
        name: root.json("GET", f"/api/collections/{name}")
        for name in ("wizards", "blueprints", "prompt_history", "saved_prompts", "likes", "admin_prompts", "llm_logs")
    }
    views["llm_timings"] = root.json("GET", "/api/admin/llm-timings")
    if len(views["llm_timings"]) != 2 or len(views["llm_logs"]) != 3:
        raise RuntimeError(f"AI calls not logged as expected: {views['llm_logs']} {views['llm_timings']}")
    return {
        "identities": {user: {"user": user, "groups": groups} for user, groups in WIZARD_IDENTITIES.items()},
        "test_identity_env": {"WIZ_ALLOW_TEST_IDENTITY": "1"},
        "seeded_globals": {
            "count": len(globals_),
            "edited": edited["id"],
            "deleted": deleted["id"],
            "kept": [row["id"] for row in globals_ if row["id"] != deleted["id"]],
        },
        "wizards": {key: row["id"] for key, row in wizards.items()},
        "blueprints": {key: {"id": row["id"], "owner": row["user_id"]} for key, row in blueprints.items()},
        "likes_count": {"foggy": 2, "lamp": 1, "market": 0},
        "likers": {"foggy": ["alice", "bob"], "lamp": ["bob"], "market": []},
        "prompt_history": [row["id"] for row in history],
        "saved_prompts": [row["id"] for row in saved],
        "admin_prompts": [row["id"] for row in admin_prompts],
        "llm_logs": {"manual": manual_log["id"], "count": len(views["llm_logs"])},
        "llm_timings": {
            "count": len(views["llm_timings"]),
            "outcomes": sorted(row["outcome"] for row in views["llm_timings"]),
        },
        "views": views,
    }


# =========================================================================== notebook

NOTEBOOK_API_KEY = "sk-release-dumps"
PROVIDER_HOST = "127.0.0.3"


def _notebook_constants():
    """The password and encryption key the notebook's tests use (tests/support/notebook.py)."""
    from tests.support.notebook import ENCRYPTION_KEY, PASSWORD

    return PASSWORD, ENCRYPTION_KEY


def fill_notebook(release, data_dir):
    from devtools.fake_providers import FakeProviders

    password, encryption_key = _notebook_constants()
    env = {
        "NOTEBOOK_PASSWORD": password,
        "NOTEBOOK_ENCRYPTION_KEY": encryption_key,
        "NOTEBOOK_EMBEDDING_PROVIDER": "none",
        "NOTEBOOK_MODEL_HOST_ALLOWLIST": f"{PROVIDER_HOST}/32",
        "NOTEBOOK_LLM_TIMEOUT": "30",
    }
    with FakeProviders(host=PROVIDER_HOST, keys={"openai": NOTEBOOK_API_KEY}) as fake:
        worker = release.start_worker(data_dir, env)  # first, as the tests do
        try:
            service = release.start_service("notebook", data_dir, env)
            try:
                fixtures = _notebook_data(service, fake, password, worker)
            finally:
                _stopped(release, service.process)
        finally:
            code = release.stop(worker)
            if code != 0:
                raise RuntimeError(f"the notebook worker ended with {code}:\n{tail(worker.log_path)}")
    fixtures["password"], fixtures["encryption_key"] = password, encryption_key
    fixtures["settings"] = {k: v for k, v in env.items() if k not in ("NOTEBOOK_PASSWORD", "NOTEBOOK_ENCRYPTION_KEY")}
    return fixtures


def _notebook_data(service, fake, password, worker):
    api = Api(service.base_url, {"Authorization": f"Bearer {password}"})

    def post(path, body, expect=(200, 201)):
        return api.json("POST", path, json=body, expect=expect)

    def wait_command(command_id):
        command = wait_for(lambda: _finished(api, command_id), f"{command_id} finishes", timeout=JOB_DEADLINE)
        if command["status"] != "completed":
            raise RuntimeError(f"{command_id} ended {command['status']}: {command}\n{tail(worker.log_path)}")
        return command

    # Provider credentials: an OpenAI-compatible server with a key (encrypted at rest),
    # and an Ollama server without one.
    compatible = post(
        "/credentials",
        {
            "name": "Local vLLM",
            "provider": "openai_compatible",
            "api_key": NOTEBOOK_API_KEY,
            "base_url": fake.base_url("openai"),
        },
    )
    ollama = post("/credentials", {"name": "Ollama box", "provider": "ollama", "base_url": fake.base_url("ollama")})
    registered = post(
        f"/credentials/{compatible['id']}/register-models",
        {"models": [{"name": "fake-chat", "type": "language"}, {"name": "fake-embed", "type": "embedding"}]},
    )
    chat_model = next(m for m in registered["models"] if m["type"] == "language")
    embed_model = next(m for m in registered["models"] if m["type"] == "embedding")
    ollama_model = post(
        "/models", {"name": "llama-fake:latest", "provider": "ollama", "type": "language", "credential": ollama["id"]}
    )
    loose_model = post("/models", {"name": "gpt-4o-mini", "provider": "openai", "type": "language"})
    defaults = post(
        "/models/config",
        {
            "default_chat_model": chat_model["id"],
            "default_transformation_model": chat_model["id"],
            "large_context_model": ollama_model["id"],
            "default_embedding_model": embed_model["id"],
        },
    )

    glaciers = post("/notebooks", {"name": "Glaciology", "description": "Ice, moraines and valleys."})
    volcanoes = post("/notebooks", {"name": "Volcanology", "description": ""})
    drafts = post("/notebooks", {"name": "Old drafts", "description": "Archived before the upgrade."})
    api.json("PUT", f"/notebooks/{drafts['id']}", json={"archived": True})

    key_terms = post(
        "/transformations",
        {
            "name": "key-terms",
            "title": "Key terms",
            "description": "The terms a reader must know.",
            "prompt": "List the key terms of the text. {braces stay} as written.",
            "apply_default": True,
        },
    )
    summary = post("/transformations", {"name": "summary", "title": "Summary", "prompt": "Summarize the text."})

    def text_source(body):
        added = post("/sources", {"type": "text", **body})
        if added.get("status") != "completed":
            raise RuntimeError(f"a synchronous text source did not complete: {added}")
        return added

    sources = {
        "glacier_basics": text_source(
            {
                "notebook_id": glaciers["id"],
                "title": "Glacier basics",
                "content": "Glaciers carve U-shaped valleys. Moraines mark where glaciers "
                "ended; crevasses open where the ice bends.\n\nFirn turns to "
                "glacier ice over decades.",
            }
        ),
        # One source in both notebooks.
        "ice_cores": text_source(
            {
                "notebooks": [glaciers["id"], volcanoes["id"]],
                "title": "Ice cores",
                "content": "Ice cores hold volcanic ash layers: each eruption leaves a dated band in the glacier ice.",
            }
        ),
        # Asks for an insight at its creation (processed once the source is).
        "lava": text_source(
            {
                "notebook_id": volcanoes["id"],
                "title": "Lava flows",
                "content": "Basalt lava flows far; rhyolite lava is thick and explosive. "
                "Pahoehoe and aa are two kinds of basalt flow.",
                "transformations": [summary["id"]],
            }
        ),
        # Chunks without embeddings.
        "unembedded": text_source(
            {
                "notebook_id": volcanoes["id"],
                "title": "Tephra notes (not embedded)",
                "content": "Tephra is everything a volcano throws into the air.",
                "embed": False,
            }
        ),
    }
    api.json("PUT", f"/sources/{sources['glacier_basics']['id']}", json={"topics": ["ice", "valleys"]})
    insight_job = post(
        f"/sources/{sources['glacier_basics']['id']}/insights", {"transformation_id": key_terms["id"]}, expect=202
    )
    wait_command(insight_job["command_id"])
    wait_for(
        lambda: api.json("GET", f"/sources/{sources['lava']['id']}/insights"),
        "the insight asked for at creation",
        timeout=JOB_DEADLINE,
    )

    notes = {
        "human": post(
            "/notes",
            {
                "notebook_id": glaciers["id"],
                "title": "Field trip",
                "content": "Visit the moraine at the valley's end; bring crampons.",
            },
        ),
        "ai": post(
            "/notes",
            {
                "notebook_id": volcanoes["id"],
                "note_type": "ai",
                "content": "Ash layers in ice cores date eruptions.\nSecond line.",
            },
        ),
    }

    quiet = post("/chat/sessions", {"notebook_id": glaciers["id"], "title": "Questions for later"})
    talked = post(
        "/chat/sessions", {"notebook_id": volcanoes["id"], "title": "Lava chat", "model_override": ollama_model["id"]}
    )
    post("/chat/execute", {"session_id": talked["id"], "message": "Which lava flows far?"})
    free = post("/chat/sessions", {"title": "No notebook"})

    podcast = post(
        "/podcasts/generate",
        {"notebook_id": glaciers["id"], "episode_name": "Ice talk", "speakers": 2, "length": "short"},
        expect=202,
    )
    wait_command(podcast["command_id"])

    # Every job done (the notes' embeddings too) before the database is copied.
    def all_finished():
        listed = api.json("GET", "/commands", params={"limit": 100})
        return listed if all(c["status"] in ("completed", "failed", "canceled") for c in listed["commands"]) else None

    commands = wait_for(all_finished, "every job finishes", timeout=JOB_DEADLINE)
    failed = [c for c in commands["commands"] if c["status"] != "completed"]
    if failed:
        raise RuntimeError(f"jobs did not complete: {failed}\n{tail(worker.log_path)}")
    search = post("/search", {"query": "glacier ice", "type": "text"})
    found = {hit["parent_id"] for hit in search["results"]}
    if not {sources["glacier_basics"]["id"], sources["ice_cores"]["id"]} <= found:
        raise RuntimeError(f"text search misses the sources: {search}")

    notebook_ids = {"glaciers": glaciers["id"], "volcanoes": volcanoes["id"], "drafts": drafts["id"]}
    source_ids = {key: s["id"] for key, s in sources.items()}
    insights = {key: api.json("GET", f"/sources/{sid}/insights") for key, sid in source_ids.items()}
    views = {
        "notebooks": {key: api.json("GET", f"/notebooks/{nid}") for key, nid in notebook_ids.items()},
        "sources": {key: api.json("GET", f"/sources/{sid}") for key, sid in source_ids.items()},
        "insights": {key: rows for key, rows in insights.items() if rows},
        "notes": {key: api.json("GET", f"/notes/{n['id']}") for key, n in notes.items()},
        "credentials": {
            key: api.json("GET", f"/credentials/{c['id']}")
            for key, c in (("compatible", compatible), ("ollama", ollama))
        },
        "models": {
            key: api.json("GET", f"/models/{m['id']}")
            for key, m in (
                ("chat", chat_model),
                ("embed", embed_model),
                ("ollama", ollama_model),
                ("loose", loose_model),
            )
        },
        "defaults": api.json("GET", "/models/defaults"),
        "transformations": {
            key: api.json("GET", f"/transformations/{t['id']}")
            for key, t in (("key_terms", key_terms), ("summary", summary))
        },
        "chat_sessions": {
            key: api.json("GET", f"/chat/sessions/{s['id']}")
            for key, s in (("quiet", quiet), ("talked", talked), ("free", free))
        },
        "episodes": {"ice_talk": api.json("GET", f"/podcasts/episodes/{podcast['episode_id']}")},
        "commands": commands,
    }
    if views["defaults"] != defaults:
        raise RuntimeError(f"defaults changed: {defaults} {views['defaults']}")
    return {
        "notebooks": notebook_ids,
        "sources": source_ids,
        "shared_source": {"source": "ice_cores", "notebooks": ["glaciers", "volcanoes"]},
        "notes": {key: n["id"] for key, n in notes.items()},
        "credentials": {
            "compatible": {
                "id": compatible["id"],
                "api_key": NOTEBOOK_API_KEY,
                "provider": "openai_compatible",
                "fake_provider": "openai",
            },
            "ollama": {"id": ollama["id"], "provider": "ollama"},
        },
        "models": {
            "chat": chat_model["id"],
            "embed": embed_model["id"],
            "ollama": ollama_model["id"],
            "loose": loose_model["id"],
        },
        "transformations": {"key_terms": key_terms["id"], "summary": summary["id"]},
        "chat_sessions": {"quiet": quiet["id"], "talked": talked["id"], "free": free["id"]},
        "episodes": {"ice_talk": podcast["episode_id"]},
        "text_search": {
            "query": "glacier ice",
            "finds": sorted(source_ids[k] for k in ("glacier_basics", "ice_cores")),
        },
        "views": views,
    }


def _finished(api, command_id):
    command = api.json("GET", f"/commands/{command_id}")
    return command if command["status"] in ("completed", "failed", "canceled") else None


# =========================================================================== SQL dumps


def _quote_name(name):
    return '"' + name.replace('"', '""') + '"'


def _table_kinds(connection):
    """{name: (type, without_rowid)} from PRAGMA table_list: table, view, shadow, virtual."""
    return {row[1]: (row[2], bool(row[4])) for row in connection.execute("PRAGMA main.table_list")}


def _columns(connection, table):
    return [row[1] for row in connection.execute(f"PRAGMA main.table_info({_quote_name(table)})")]


def _row_inserts(connection, table, order):
    columns = _columns(connection, table)
    values = " || ',' || ".join(f"quote({_quote_name(c)})" for c in columns)
    prefix = f"INSERT INTO {_quote_name(table)} VALUES("
    query = f"SELECT {values} FROM {_quote_name(table)} ORDER BY {order}"
    return [f"{prefix}{row[0]});" for row in connection.execute(query)]


def _order_of(connection, table, without_rowid):
    if not without_rowid:
        return "rowid"
    keys = sorted(
        (row[5], row[1]) for row in connection.execute(f"PRAGMA main.table_info({_quote_name(table)})") if row[5]
    )
    return ", ".join(_quote_name(name) for _, name in keys)


def _fts5_statements(connection, name, sql):
    if not re.search(r"\busing\s+fts5\s*\(", sql, re.IGNORECASE):
        raise RuntimeError(f"{name}: only FTS5 virtual tables can be dumped, not {sql!r}")
    statements = [f"{sql};"]
    table = _quote_name(name)
    config = connection.execute(
        f"SELECT k, quote(v) FROM {_quote_name(name + '_config')} WHERE k <> 'version' ORDER BY k"
    )
    statements += [f"INSERT INTO {table}({table}, rank) VALUES({_sql_text(k)}, {v});" for k, v in config]
    columns = _columns(connection, name)
    values = " || ',' || ".join(f"quote({_quote_name(c)})" for c in ["rowid", *columns])
    listed = ", ".join(["rowid", *map(_quote_name, columns)])
    rows = connection.execute(f"SELECT {values} FROM {table} ORDER BY rowid")
    statements += [f"INSERT INTO {table}({listed}) VALUES({row[0]});" for row in rows]
    return statements


def _sql_text(text):
    return "'" + text.replace("'", "''") + "'"


def dump_sql(path):
    """The database at `path` as SQL text that rebuilds it in an empty file."""
    connection = sqlite3.connect(path)
    try:
        kinds = _table_kinds(connection)
        lines = ["PRAGMA foreign_keys=OFF;", "BEGIN TRANSACTION;"]
        user_version = connection.execute("PRAGMA user_version").fetchone()[0]
        if user_version:
            lines.append(f"PRAGMA user_version={int(user_version)};")
        virtual, sequences = [], []
        tables = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql NOT NULL ORDER BY name"
        ).fetchall()
        for name, sql in tables:
            kind, without_rowid = kinds.get(name, ("table", False))
            if kind == "shadow":
                continue
            if kind == "virtual" or sql.upper().startswith("CREATE VIRTUAL TABLE"):
                virtual.append((name, sql))
                continue
            if name == "sqlite_sequence":
                sequences = ['DELETE FROM "sqlite_sequence";', *_row_inserts(connection, name, "rowid")]
                continue
            if name.startswith("sqlite_"):
                continue  # sqlite_stat*: statistics, rebuilt by ANALYZE
            lines.append(f"{sql};")
            lines += _row_inserts(connection, name, _order_of(connection, name, without_rowid))
        lines += sequences
        for name, sql in virtual:
            lines += _fts5_statements(connection, name, sql)
        shadows = {name for name, (kind, _) in kinds.items() if kind == "shadow"}
        others = connection.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type IN "
            "('index', 'trigger', 'view') AND sql NOT NULL ORDER BY type, name"
        )
        lines += [f"{sql};" for name, table, sql in others if table not in shadows]
        lines.append("COMMIT;")
        return "\n".join(lines) + "\n"
    finally:
        connection.close()


def _contents(path):
    """{table: rows} of every table but the shadow ones (virtual tables through
    themselves, with their rowid), and the schema's statements."""
    connection = sqlite3.connect(path)
    try:
        kinds = _table_kinds(connection)
        contents = {}
        for name, (kind, without_rowid) in sorted(kinds.items()):
            if kind in ("shadow", "view") or name.startswith("sqlite_"):
                continue
            order = "rowid" if kind == "virtual" else _order_of(connection, name, without_rowid)
            select = "rowid, *" if kind == "virtual" else "*"
            contents[name] = connection.execute(f"SELECT {select} FROM {_quote_name(name)} ORDER BY {order}").fetchall()
        schema = connection.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql NOT NULL ORDER BY type, name"
        ).fetchall()
        shadows = {name for name, (kind, _) in kinds.items() if kind == "shadow"}
        contents["sqlite_master"] = [row for row in schema if row[1] not in shadows]
        contents["user_version"] = connection.execute("PRAGMA user_version").fetchall()
        for name, (kind, _) in kinds.items():
            if kind == "virtual":
                contents[name + "_config"] = connection.execute(
                    f"SELECT k, v FROM {_quote_name(name + '_config')} WHERE k <> 'version' ORDER BY k"
                ).fetchall()
        return contents
    finally:
        connection.close()


def check_dump(sql, original, scratch, match=None):
    """Load `sql` into an empty file: the same tables, rows and schema as `original`;
    FTS5 tables pass their integrity check and answer MATCH (`match`: {table: (query,
    rowids expected among the hits)}); and the loaded copy dumps to the same text."""
    loaded = Path(scratch) / (Path(original).stem + "-loaded.db")
    if loaded.exists():
        loaded.unlink()
    connection = sqlite3.connect(loaded)
    try:
        connection.executescript(sql)
        for table, (query, expected) in (match or {}).items():
            connection.execute(f"INSERT INTO {_quote_name(table)}({_quote_name(table)}) VALUES('integrity-check')")
            hits = {
                row[0]
                for row in connection.execute(
                    f"SELECT rowid FROM {_quote_name(table)} WHERE {_quote_name(table)} MATCH ?", (query,)
                )
            }
            if not hits or not set(expected) <= hits:
                raise RuntimeError(f"{table} MATCH {query!r} after loading: {sorted(hits)}, expected {expected}")
        connection.commit()
    finally:
        connection.close()
    before, after = _contents(original), _contents(loaded)
    if before != after:
        differing = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
        raise RuntimeError(f"the dump of {original} does not rebuild it: {differing} differ")
    if dump_sql(loaded) != sql:
        raise RuntimeError(f"the dump of {original} is not stable: dumping the loaded copy gives other text")


def _fts_probe(path):
    """A word of the first source's title and the rowids it must find, for check_dump."""
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute(
            "SELECT rowid, title FROM search_fts WHERE parent LIKE 'source:%' ORDER BY rowid"
        ).fetchall()
    finally:
        connection.close()
    if not rows:
        raise RuntimeError("the notebook's full-text index is empty")
    word = max(re.findall(r"\w+", rows[0][1]), key=len)
    return {"search_fts": (f'"{word}"', [rows[0][0]])}


def table_counts(path):
    connection = sqlite3.connect(path)
    try:
        kinds = _table_kinds(connection)
        return {
            name: connection.execute(f"SELECT count(*) FROM {_quote_name(name)}").fetchone()[0]
            for name, (kind, _) in sorted(kinds.items())
            if kind in ("table", "virtual") and not name.startswith("sqlite_")
        }
    finally:
        connection.close()


# =========================================================================== main

FILLERS = {"workspace": fill_workspace, "wizard": fill_wizard, "notebook": fill_notebook}


def git(*args, capture=True):
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=capture, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip() if capture else ""


def build(tag, scratch):
    commit = git("rev-parse", "--verify", f"{tag}^{{commit}}")
    tree = scratch / "tree"
    git("worktree", "add", "--detach", str(tree), tag)
    release = Release(tree, scratch)
    try:
        (tree / ".venv").symlink_to(ROOT / ".venv")
        release.check_code()
        out = OUT_DIR / tag
        out.mkdir(parents=True, exist_ok=True)
        fixtures = {"release": tag, "commit": commit, "services": {}}
        for name in SERVICES:
            data_dir = scratch / f"{name}-data"
            data_dir.mkdir()
            log(f"{name}: starting the release's service and filling it")
            fixtures["services"][name] = FILLERS[name](release, data_dir)
            database = data_dir / DB_FILES[name]
            sql = dump_sql(database)
            if str(scratch) in sql:
                raise RuntimeError(f"the {name} dump holds a path of the temporary directory {scratch}")
            check_dump(sql, database, scratch, match=_fts_probe(database) if name == "notebook" else None)
            fixtures["services"][name]["database_file"] = DB_FILES[name]
            fixtures["services"][name]["tables"] = counts = table_counts(database)
            empty = sorted(table for table, count in counts.items() if not count)
            log(f"{name}: {sum(counts.values())} rows in {len(counts)} tables; empty: {', '.join(empty) or 'none'}")
            (out / f"{name}.sql").write_text(sql)
            log(f"{name}: wrote {out / (name + '.sql')} ({len(sql.splitlines())} lines)")
        (out / "fixtures.json").write_text(json.dumps(fixtures, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        log(f"wrote {out / 'fixtures.json'}")
    finally:
        release.stop_all()
        try:
            git("worktree", "remove", "--force", str(tree))
        except RuntimeError as exc:
            log(f"{exc}; pruning")
            shutil.rmtree(tree, ignore_errors=True)
            git("worktree", "prune")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", help="the release's git tag, e.g. v0.1.0")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (data, logs) and say where")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="release-dumps-"))
    failed = True
    try:
        build(args.tag, scratch)
        failed = False
    finally:
        if args.keep or failed:
            log(f"the temporary directory (data directories, logs) is kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
