"""Upgrading from release 0.1.0 (the last release without schema migrations).

Its databases were filled through the release's own API and dumped as SQL by
`python -m devtools.release_dumps v0.1.0` (tests/migrations/v0.1.0/: one dump per
service and fixtures.json, what was created). Each test loads a dump where the current
code opens its database under a new DATA_DIR, starts the current service on it (the
notebook with its job worker), and checks through the API that everything the release
wrote is there with its values, that every GET route answers with the loaded data,
and that a write works afterwards.

What a SQL dump does not carry is not checked for content: files under DATA_DIR (the
podcast episode's MP3; text sources never had an original file), which is why those
two routes answer 404 here, and the wizard's /uploads/<name> (the data set uploads
nothing). Of the workspace's websockets only the agent's connection is exercised (a
real agent with the release's token, and an app through it); the terminal's and the
relay's need nothing from the database that this does not already check.
"""

import importlib
import json
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests

from app import registry
from app.common import live_processes
from app.common.db import open_for_command
from app.common.migrations import EXPAND, contract
from app.common.sse_client import iter_records
from devtools import services
from devtools.release_dumps import table_counts
from devtools.waiting import wait_for

RELEASE = "v0.1.0"
ROOT = Path(__file__).resolve().parents[2]
DUMPS = Path(__file__).resolve().parent / RELEASE
FIXTURES = json.loads((DUMPS / "fixtures.json").read_text())
# Where the current code opens each database by default (app/<service>/settings.py:
# DATABASE_URL defaults to sqlite:///$DATA_DIR/<file>).
DATABASE_FILES = {"workspace": "workspace.db", "wizard": "wizard.db", "notebook": "notebook.db"}
TIMEOUT = 30


def fixtures_of(service):
    return FIXTURES["services"][service]


def load_release_database(data_dir, service):
    """The release's dump, loaded into a new file where the current code opens it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / DATABASE_FILES[service]
    connection = sqlite3.connect(path)
    try:
        connection.executescript((DUMPS / f"{service}.sql").read_text())
    finally:
        connection.close()
    assert table_counts(path) == fixtures_of(service)["tables"]
    return path


def within_the_sessions_lifetime(path):
    """The release's workspace session tokens, given back their lifetime from now.

    The release minted them with its default lifetime (24 h) when the dump was made, and
    a token that old is refused as expired, upgrade or not. What this test asks is
    whether an upgrade keeps a live session: so the upgrade is made to come within
    their lifetime, the only column changed by hand (assert_rows_kept leaves it out)."""
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE apikey SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 day')")


def assert_rows_kept(path, service, rewritten=()):
    """Once the current code has opened (and migrated) the database, before the test
    writes anything: every table of the release holds the same rows, with the same
    values in every column the release had (new columns aside). `rewritten`: the
    (table, column) pairs a migration step changes on purpose."""
    counts = table_counts(path)
    expected = fixtures_of(service)["tables"]
    assert {table: counts.get(table) for table in expected} == expected
    release = sqlite3.connect(":memory:")
    current = sqlite3.connect(path)
    try:
        release.executescript((DUMPS / f"{service}.sql").read_text())
        virtual = {name for (name,) in release.execute("SELECT name FROM pragma_table_list WHERE type = 'virtual'")}
        for table in expected:
            columns = [
                row[1] for row in release.execute(f'PRAGMA table_info("{table}")') if (table, row[1]) not in rewritten
            ]
            if table in virtual:
                columns.insert(0, "rowid")
            listed = ", ".join(column if column == "rowid" else f'"{column}"' for column in columns)
            query = f'SELECT {listed} FROM "{table}" ORDER BY {listed}'
            before, after = release.execute(query).fetchall(), current.execute(query).fetchall()
            if before != after:
                changed = [
                    column
                    for i, column in enumerate(columns)
                    if sorted(repr(row[i]) for row in before) != sorted(repr(row[i]) for row in after)
                ]
                raise AssertionError(
                    f"{service}: the upgrade changed rows of {table!r}, in the column(s) {changed}: "
                    f"the release had {before}, now {after}"
                )
    finally:
        release.close()
        current.close()


def assert_schema_history(data_dir, service):
    """The upgrade recorded release 0.1.0 as version 1, then every newer expand step
    once; with its contract steps run (as `python -m app.<service> contract` runs them
    once every host runs the current code), it has every step and the same schema as
    the current code makes in a new database."""
    migrations = registry.service(service).migrations
    history = importlib.import_module(migrations).HISTORY
    path = data_dir / DATABASE_FILES[service]
    started = [(version,) for version, _ in recorded_history(path)]
    assert started == [(step.version,) for step in history.steps if step.phase == EXPAND]
    db = open_for_command(f"sqlite:///{path}", history)
    try:
        contract(db, history, live_processes.RELEASE)
    finally:
        db.close()
    assert recorded_history(path) == [(step.version, step.name) for step in history.steps]
    fresh = data_dir.parent / f"{service}-fresh-{data_dir.name}.db"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from {migrations} import open_database; open_database({f'sqlite:///{fresh}'!r})",
        ],
        cwd=ROOT,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert schema_of(path) == schema_of(fresh), f"the migrated {service} schema is not the one a new database gets"


def recorded_history(path):
    """[(version, name)] of the database's history: both tables (the expand steps since
    0.2.0 are in schema_expansions, a contract step copies every step below it into
    schema_migrations)."""
    with sqlite3.connect(path) as connection:
        tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return connection.execute(
            "SELECT version, name FROM schema_migrations"
            + (" UNION SELECT version, name FROM schema_expansions" if "schema_expansions" in tables else "")
            + " ORDER BY version"
        ).fetchall()


def schema_of(path):
    """{table: {column: (type, not null, default, primary key)}, plus its foreign keys and
    indexes}: what a migration must leave as a new database has it (column order aside:
    an added column comes last)."""
    with sqlite3.connect(path) as connection:
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                "AND name NOT LIKE 'search_fts_%'"
            )
        ]
        return {
            table: {
                "columns": {row[1]: tuple(row[2:6]) for row in connection.execute(f"PRAGMA table_info('{table}')")},
                "foreign_keys": sorted(
                    tuple(row[2:]) for row in connection.execute(f"PRAGMA foreign_key_list('{table}')")
                ),
                "indexes": sorted(
                    (row[1].replace(table, "<table>"), row[2])
                    for row in connection.execute(f"PRAGMA index_list('{table}')")
                    if not row[1].startswith("sqlite_autoindex")
                ),
            }
            for table in tables
        }


def assert_view(actual, recorded, ignore=(), where="view"):
    """`actual` has every field of `recorded`, with the same value (new fields may be added)."""
    for key, value in recorded.items():
        if key in ignore:
            continue
        assert key in actual, f"{where}: the field {key!r} is gone: {actual}"
        if _records(value) and _records(actual[key]) and len(value) == len(actual[key]):
            for index, (item, recorded_item) in enumerate(zip(actual[key], value)):  # the same, field by field
                assert_view(item, recorded_item, where=f"{where}.{key}[{index}]")
            continue
        assert actual[key] == value, f"{where}.{key}: {actual[key]!r}, the release had {value!r}"


def _records(value):
    return isinstance(value, list) and all(isinstance(item, dict) for item in value) and bool(value)


def ok(response, what=None):
    assert 200 <= response.status_code < 300, f"{what or response.url}: {response.status_code} {response.text[:500]}"
    return response


def stream_opens(url, headers, first_records=0):
    """An SSE route answers 200 with an event stream; returns its first records' JSON."""
    records = []
    with requests.get(url, headers=headers, stream=True, timeout=TIMEOUT) as stream:
        ok(stream)
        assert stream.headers["Content-Type"].startswith("text/event-stream"), stream.headers
        if first_records:
            for record in iter_records(stream):
                records.append(record.json())
                if len(records) == first_records:
                    break
    return records


# =========================================================================== workspace


def _provider_at_release_issuer(oidc, base_url):
    """The identity provider again at the release's issuer (the stored links name it),
    or None, with a warning, when that port is taken."""
    from devtools.oidc_provider import OidcProvider, pbkdf2_sha512_digest

    port = urlsplit(oidc["issuer"]).port
    idp = OidcProvider(
        {
            "clients": [
                {
                    "client_id": oidc["client_id"],
                    "client_name": "Workspace",
                    "client_secret_digest": pbkdf2_sha512_digest(oidc["client_secret"], rounds=1000),
                    "redirect_uris": [base_url + "/api/v2/users/oidc/callback"],
                }
            ],
            "users": [{**user, "password": oidc["password"]} for user in oidc["users"]],
        },
        port=port,
    )
    try:
        idp.start()
    except OSError:
        warnings.warn(
            f"port {port} of the release's OIDC issuer is taken: sign-in through the stored OIDC links "
            "is not checked this time",
            stacklevel=2,
        )
        return None
    assert idp.issuer == oidc["issuer"]
    return idp


def _sso(base_url, username, password):
    """The single sign-on chain as a browser runs it: the session token it ends with."""
    from devtools.oidc_provider import sign_in

    with requests.Session() as http:
        start = http.get(base_url + "/api/v2/users/oidc/callback", timeout=TIMEOUT, allow_redirects=False)
        assert start.status_code in (302, 303), start.text
        location = sign_in(http, start.headers["Location"], username, password)
        finished = http.get(urljoin(base_url, location), timeout=TIMEOUT, allow_redirects=False)
        assert finished.status_code == 303, finished.text
        return http.cookies.get("workspace_session_token")


def test_workspace_upgrade(start_service, tmp_path):
    from tests.support.workspace import TOKEN_HEADER, AgentProcess, Workspace, wait_status
    from tests.support.workspace_app import LocalApp

    fx = fixtures_of("workspace")
    data_dir = tmp_path / "workspace-data"
    path = load_release_database(data_dir, "workspace")
    within_the_sessions_lifetime(path)
    port = services.free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {"WORKSPACE_ACCESS_URL": base_url, **fx["settings"]}
    idp = _provider_at_release_issuer(fx["oidc"], base_url)
    if idp is not None:
        env.update(
            {
                "WORKSPACE_OIDC_ISSUER_URL": idp.issuer,
                "WORKSPACE_OIDC_CLIENT_ID": fx["oidc"]["client_id"],
                "WORKSPACE_OIDC_CLIENT_SECRET": fx["oidc"]["client_secret"],
            }
        )
    local_app = LocalApp()
    agent = None
    try:
        ws = Workspace(start_service("workspace", data_dir=data_dir, env=env, port=port))
        assert_rows_kept(path, "workspace", rewritten=[("apikey", "expires_at")])
        assert_schema_history(data_dir, "workspace")
        users, tokens = fx["users"], fx["tokens"]

        def call(method, route, token=None, **kwargs):
            headers = {TOKEN_HEADER: token} if token else {}
            return requests.request(
                method, ws.api + route, headers=headers, timeout=TIMEOUT, allow_redirects=False, **kwargs
            )

        # The session tokens the release minted: still valid, the signed-out one still revoked.
        for name, entry in tokens.items():
            me = call("GET", "/users/me", entry["token"])
            if entry["revoked"]:
                assert me.status_code == 401, (name, me.text)
            else:
                assert ok(me, name).json()["id"] == users[entry["user"]]["id"]
        owner, member = tokens["owner_first"]["token"], tokens["member_login"]["token"]
        by_user = {"owner": owner, "member": member, "dave": tokens["dave_sso"]["token"]}
        for key, recorded in fx["views"]["users"].items():
            assert_view(call("GET", "/users/me", by_user[key]).json(), recorded, where=f"users/me of {key}")

        # Passwords: the release's scrypt hashes still sign in; the others still cannot.
        for key in ("owner", "member"):
            credentials = {"email": users[key]["email"], "password": users[key]["password"]}
            login = call("POST", "/users/login", json=credentials)
            assert login.status_code == 201, login.text
            assert call("GET", "/users/me", login.json()["session_token"]).json()["id"] == users[key]["id"]
        wrong = call("POST", "/users/login", json={"email": users["member"]["email"], "password": "not the password"})
        assert wrong.status_code == 401
        for key in ("robot", "dave"):  # login types none and oidc: no password sign-in
            refused = call("POST", "/users/login", json={"email": users[key]["email"], "password": "any password 42"})
            # The same answer as a wrong password: it never tells which emails sign in elsewhere.
            assert refused.status_code == 401 and refused.json() == wrong.json(), refused.text

        # Workspaces, agents and apps, as the release answered them (statuses aside:
        # they follow the clock).
        dev, lab = fx["workspaces"]["dev"], fx["workspaces"]["lab"]
        assert [w["id"] for w in ok(call("GET", "/users/me/workspaces", owner)).json()] == [dev["id"]]
        assert [w["id"] for w in ok(call("GET", "/users/member/workspaces", owner)).json()] == [lab["id"]]
        assert [w["id"] for w in ok(call("GET", "/users/owner/workspaces", owner)).json()] == [dev["id"]]
        assert [w["id"] for w in ok(call("GET", "/users/me/workspaces", member)).json()] == [lab["id"]]
        assert call("GET", f"/workspaces/{dev['id']}", member).status_code == 404
        for name, recorded in fx["views"]["workspaces"].items():
            current = ok(call("GET", f"/workspaces/{recorded['id']}", owner)).json()
            assert_view(current, recorded, ignore=("agents",), where=f"workspace {name}")
            assert [a["id"] for a in current["agents"]] == [a["id"] for a in recorded["agents"]]
            for now, then in zip(current["agents"], recorded["agents"]):
                where = f"agent {name}.{then['name']}"
                assert_view(now, then, ignore=("status",), where=where)
                if then["first_connected_at"]:
                    assert now["status"] == "disconnected", where
                else:  # never connected: `timeout` once the connection time-out has passed
                    assert now["status"] in ("connecting", "timeout"), where
                detail = ok(call("GET", f"/workspaceagents/{then['id']}", owner)).json()
                assert_view(detail, then, ignore=("status",), where=where)
        main = next(a for a in fx["views"]["workspaces"]["dev"]["agents"] if a["name"] == "main")
        reported = fx["reported_app"]
        assert {"slug": reported["slug"], "url": reported["url"]} in [
            {"slug": a["slug"], "url": a["url"]} for a in main["apps"]
        ]
        snapshot = stream_opens(ws.api + "/users/me/workspaces/watch", {TOKEN_HEADER: owner}, first_records=2)
        assert {s["agent_id"] for s in snapshot} == set(dev["agents"].values())

        # The other GET routes, with the loaded data.
        for route in (
            "/healthz",
            "/api/v2/buildinfo",
            "/api/v2/users/authmethods",
            "/api/v2/users/first",
            "/login",
            "/static/vendor/xterm/xterm.js",
            "/static/dashboard.js",
        ):
            ok(requests.get(ws.url + route, timeout=TIMEOUT), route)
        assert requests.get(ws.url + "/setup", timeout=TIMEOUT, allow_redirects=False).headers["Location"] == "/login"
        cookies = {"workspace_session_token": owner}
        dashboard = ok(requests.get(ws.url + "/", cookies=cookies, timeout=TIMEOUT))
        assert all(f'data-agent-id="{agent_id}"' in dashboard.text for agent_id in dev["agents"].values())
        ok(requests.get(ws.url + "/@owner/dev.main/terminal", cookies=cookies, timeout=TIMEOUT))

        # Agent tokens minted by the release (one rotated) still authenticate the agent
        # connection (a plain request: 400 asking for the upgrade, where a bad token is 401).
        rpc = ws.api + "/workspaceagents/me/rpc"
        for name, token in fx["agent_tokens"].items():
            answer = requests.get(rpc, headers={TOKEN_HEADER: token}, timeout=TIMEOUT)
            assert answer.status_code == 400, (name, answer.text)
        assert requests.get(rpc, headers={TOKEN_HEADER: "AAAAAAAAAA-" + "b" * 22}, timeout=TIMEOUT).status_code == 401
        # ... and a real agent connects with one; its app answers through the platform,
        # to the owner only (sharing level `owner`).
        agent = AgentProcess(tmp_path, ws.url, fx["agent_tokens"]["dev.main"], apps=[("code", local_app.url)])
        wait_status(ws, owner, main["id"], "connected")
        hello = requests.get(ws.url + "/@owner/dev.main/apps/code/hello", cookies=cookies, timeout=TIMEOUT)
        assert ok(hello).content, hello
        assert (
            requests.get(
                ws.url + "/@owner/dev.main/apps/code/hello", timeout=TIMEOUT, headers={TOKEN_HEADER: member}
            ).status_code
            == 404
        )

        # Single sign-on through the links the release stored: the same accounts, none new.
        if idp is not None:
            for provider_user, key in fx["oidc"]["linked"].items():
                token = _sso(ws.url, provider_user, fx["oidc"]["password"])
                assert call("GET", "/users/me", token).json()["id"] == users[key]["id"], provider_user
            assert ws.count("user") == fx["tables"]["user"]
            assert ws.count("oidclink") == fx["tables"]["oidclink"]

        # A write afterwards: a workspace and an account, read back.
        created = call(
            "POST",
            "/users/me/workspaces",
            owner,
            json={
                "name": "after-upgrade",
                "agents": [{"name": "main", "apps": [{"slug": "web", "url": "http://127.0.0.1:8000"}]}],
            },
        )
        assert created.status_code == 201, created.text
        again = ok(call("GET", f"/workspaces/{created.json()['id']}", owner)).json()
        assert again["name"] == "after-upgrade" and again["agents"][0]["apps"][0]["slug"] == "web"
        account = call(
            "POST",
            "/users",
            owner,
            json={"email": "late@example.com", "username": "late", "password": "plum orchard at noon"},
        )
        assert account.status_code == 201, account.text
        late = call("POST", "/users/login", json={"email": "late@example.com", "password": "plum orchard at noon"})
        assert call("GET", "/users/me", late.json()["session_token"]).json()["id"] == account.json()["id"]
    finally:
        if agent is not None:
            agent.stop()
        local_app.stop()
        if idp is not None:
            idp.stop()


# =========================================================================== wizard

COLLECTIONS = ("wizards", "blueprints", "prompt_history", "saved_prompts", "likes", "admin_prompts", "llm_logs")


def test_wizard_upgrade(start_service, tmp_path):
    from tests.support.wizard import TEST_IDENTITY, WizardClient

    fx = fixtures_of("wizard")
    data_dir = tmp_path / "wizard-data"
    path = load_release_database(data_dir, "wizard")
    assert fx["test_identity_env"] == TEST_IDENTITY
    service = start_service("wizard", data_dir=data_dir, env=TEST_IDENTITY)
    assert_rows_kept(path, "wizard")  # the global wizards were not seeded again
    assert_schema_history(data_dir, "wizard")
    who = {user: WizardClient(service.base_url, user, spec["groups"]) for user, spec in fx["identities"].items()}
    root, alice, bob = who["root"], who["alice"], who["bob"]

    def rows(client, collection, **filters):
        query = {"filter": json.dumps(filters)} if filters else None
        return ok(client.get(f"/api/collections/{collection}", params=query)).json()

    # Every row as the release answered it (an administrator reads them all).
    for collection in COLLECTIONS:
        assert rows(root, collection) == fx["views"][collection], collection
    assert ok(root.get("/api/admin/llm-timings")).json() == fx["views"]["llm_timings"]
    assert sorted(t["outcome"] for t in fx["views"]["llm_timings"]) == fx["llm_timings"]["outcomes"]

    # The global wizards: the edited one kept its edit, the deleted one stayed deleted.
    globals_ = {row["id"]: row for row in rows(root, "wizards") if row.get("user_id") is None}
    assert sorted(globals_) == sorted(fx["seeded_globals"]["kept"])
    assert fx["seeded_globals"]["deleted"] not in globals_
    assert globals_[fx["seeded_globals"]["edited"]]["description"] == "Edited by an administrator before the upgrade."

    # Scopes: each identity sees what it saw; like counts and likers as they were.
    blueprints = fx["blueprints"]
    counts = {row["id"]: row["likes_count"] for row in rows(root, "blueprints")}
    assert {key: counts[b["id"]] for key, b in blueprints.items()} == fx["likes_count"]
    for key, likers in fx["likers"].items():
        assert sorted(row["user_id"] for row in rows(root, "likes", blueprint_id=blueprints[key]["id"])) == likers
    assert {row["id"] for row in rows(alice, "blueprints")} == {blueprints["foggy"]["id"], blueprints["market"]["id"]}
    assert {row["id"] for row in rows(bob, "blueprints")} == {b["id"] for b in blueprints.values()}
    assert fx["wizards"]["alice_private"] not in {row["id"] for row in rows(bob, "wizards")}
    assert fx["wizards"]["bob_public"] in {row["id"] for row in rows(alice, "wizards")}
    for user in ("alice", "bob", "public"):
        mine = rows(who[user], "saved_prompts")
        assert mine and {row["user_id"] for row in mine} == {user}
    assert {row["user_id"] for row in rows(alice, "prompt_history")} == {"alice"}
    assert len(rows(alice, "admin_prompts")) == len(fx["admin_prompts"])
    assert alice.get("/api/collections/llm_logs").status_code == 403

    # The other GET routes.
    for user, client in who.items():
        me = ok(client.get("/api/me")).json()
        assert me["id"] == user and me["is_admin"] == (user == "root")
    for route in ("/healthz", "/", "/blueprints", "/library", "/admin", "/static/common.js"):
        ok(root.get(route), route)
    for route in ("/api/events", "/api/ai/phases", "/api/ai/thoughts/tab-after-upgrade"):
        stream_opens(service.base_url + route, root.headers())

    # Writes afterwards: a like taken back from a release row, and a new blueprint liked.
    assert ok(bob.post("/api/likes/toggle", json={"blueprint_id": blueprints["foggy"]["id"]})).json() == {
        "liked": False,
        "likes_count": 1,
    }
    created = alice.post("/api/collections/blueprints", json={"title": "After the upgrade", "is_public": True})
    assert created.status_code == 201, created.text
    new_id = created.json()["id"]
    assert ok(bob.post("/api/likes/toggle", json={"blueprint_id": new_id})).json() == {"liked": True, "likes_count": 1}
    (row,) = [r for r in rows(root, "blueprints") if r["id"] == new_id]
    assert row["title"] == "After the upgrade" and row["user_id"] == "alice" and row["likes_count"] == 1


# =========================================================================== notebook


def test_notebook_upgrade(start_service, tmp_path):
    from devtools.fake_providers import FakeProviders
    from tests.support.notebook import PASSWORD, PROVIDER_HOST, Worker, notebook_env

    fx = fixtures_of("notebook")
    data_dir = tmp_path / "notebook-data"
    path = load_release_database(data_dir, "notebook")
    assert fx["password"] == PASSWORD
    env = notebook_env(
        data_dir,
        NOTEBOOK_ENCRYPTION_KEY=fx["encryption_key"],
        NOTEBOOK_EMBEDDING_PROVIDER="none",
        NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
        OPENAI_API_KEY="",
        OPENAI_BASE_URL="",
        ANTHROPIC_API_KEY="",
        OLLAMA_API_BASE="",
    )
    worker = Worker(data_dir, env)
    try:
        service = start_service("notebook", data_dir=data_dir, env=env)
        assert_rows_kept(path, "notebook")
        assert_schema_history(data_dir, "notebook")
        with sqlite3.connect(path) as connection:  # the index's BM25 weights came along
            assert connection.execute("SELECT v FROM search_fts_config WHERE k = 'rank'").fetchone() == (
                "bm25(5.0, 1.0)",
            )
        _check_notebook(service, fx, worker, FakeProviders, PROVIDER_HOST)

        def registered():  # the job worker and the web worker, as live processes of this release
            with sqlite3.connect(path) as connection:
                return sorted(connection.execute("SELECT role, release FROM live_processes").fetchall())

        assert wait_for(registered, "the notebook's processes to register", 30) == [
            ("job worker", live_processes.RELEASE),
            ("web worker", live_processes.RELEASE),
        ]
    finally:
        worker.stop()
    assert [role for role, _ in registered()] == ["web worker"]  # a stopped worker removes its row


def _check_notebook(service, fx, worker, FakeProviders, provider_host):
    auth = {"Authorization": f"Bearer {fx['password']}"}

    def call(method, route, **kwargs):
        return requests.request(method, service.base_url + route, headers=auth, timeout=TIMEOUT, **kwargs)

    def get(route, **kwargs):
        return ok(call("GET", route, **kwargs), route).json()

    views = fx["views"]
    # Every record as the release answered it, but for the fields whose shape changed on
    # purpose since (for Open Notebook's clients): a text source's `asset` is null, and
    # `decryption_error` is a reason or null (checked just below).
    changed = {"sources": ("asset",), "credentials": ("decryption_error",)}
    for kind, route in (
        ("notebooks", "/notebooks/{}"),
        ("sources", "/sources/{}"),
        ("notes", "/notes/{}"),
        ("credentials", "/credentials/{}"),
        ("models", "/models/{}"),
        ("transformations", "/transformations/{}"),
        ("chat_sessions", "/chat/sessions/{}"),
        ("episodes", "/podcasts/episodes/{}"),
    ):
        for key, recorded in views[kind].items():
            current = get(route.format(recorded["id"]))
            assert_view(current, recorded, ignore=changed.get(kind, ()), where=f"{kind}.{key}")
            if kind == "sources":
                assert current["asset"] is None if current["type"] == "text" else current["asset"]["url"]
            if kind == "credentials":
                assert current["decryption_error"] is None and current["modalities"] == []
    for key, recorded in views["insights"].items():
        assert get(f"/sources/{fx['sources'][key]}/insights") == recorded
        for insight in recorded:
            assert get(f"/insights/{insight['id']}") == insight
    assert get("/models/defaults") == {**views["defaults"], "default_tools_model": None}  # a slot added since
    commands = get("/commands", params={"limit": 100})
    assert all(c.pop("job_id") == c["id"] for c in commands["commands"])  # Open Notebook's name, added since
    assert commands == views["commands"]
    compatible = get(f"/credentials/{fx['credentials']['compatible']['id']}")
    assert compatible["has_api_key"] is True and compatible["decryption_error"] is None
    talked = get(f"/chat/sessions/{fx['chat_sessions']['talked']}")
    assert [m["type"] for m in talked["messages"]] == ["human", "ai"]

    # Lists, filters and the other GET routes, with the loaded ids.
    notebooks = fx["notebooks"]
    assert {n["id"] for n in get("/notebooks")} == set(notebooks.values())
    assert [n["id"] for n in get("/notebooks", params={"archived": "true"})] == [notebooks["drafts"]]
    listed = call("GET", "/sources")
    assert ok(listed).headers["X-Total-Count"] == str(len(fx["sources"]))
    shared = fx["sources"][fx["shared_source"]["source"]]
    for notebook in fx["shared_source"]["notebooks"]:
        assert shared in {s["id"] for s in get("/sources", params={"notebook_id": notebooks[notebook]})}
        assert {n["id"] for n in get("/notes", params={"notebook_id": notebooks[notebook]})} <= set(
            fx["notes"].values()
        )
        get("/chat/sessions", params={"notebook_id": notebooks[notebook]})
    for source_id in fx["sources"].values():
        assert get(f"/sources/{source_id}/status")["status"] == "completed"
        # Text sources have no original file (in the release as now).
        assert call("GET", f"/sources/{source_id}/download").status_code == 404
    assert {n["id"] for n in get("/notes")} == set(fx["notes"].values())
    assert {c["id"] for c in get("/chat/sessions")} == set(fx["chat_sessions"].values())
    assert {t["id"] for t in get("/transformations")} == set(fx["transformations"].values())
    assert {m["id"] for m in get("/models")} == set(fx["models"].values())
    assert [m["id"] for m in get("/models", params={"type": "embedding"})] == [fx["models"]["embed"]]
    assert {c["id"] for c in get("/credentials")} == {c["id"] for c in fx["credentials"].values()}
    assert get("/credentials/status")["providers"]["openai_compatible"]["credentials"] == 1
    get("/credentials/env-status")
    assert {e["id"] for e in get("/podcasts/episodes")} == set(fx["episodes"].values())
    for episode_id in fx["episodes"].values():
        # The MP3 is a file under DATA_DIR, not a row: the dump does not carry it.
        assert call("GET", f"/podcasts/episodes/{episode_id}/audio").status_code == 404
    completed = get("/commands", params={"status": "completed"})
    assert completed["total_count"] == views["commands"]["total_count"]
    for command in views["commands"]["commands"]:
        assert get(f"/commands/{command['id']}") == {**command, "job_id": command["id"]}
    for route in (
        "/health",
        "/openapi.json",
        "/docs",
        "/docs/ui/swagger-ui.css",
        "/docs/assets/docs.js",
        "/api/notebooks",
    ):
        ok(call("GET", route), route)

    # Text search finds the release's sources, in a notebook's scope too.
    found = call("POST", "/search", json={"query": fx["text_search"]["query"], "type": "text"})
    assert set(fx["text_search"]["finds"]) <= {hit["parent_id"] for hit in ok(found).json()["results"]}
    scoped = call("POST", "/search", json={"query": "glacier", "type": "text", "notebook_id": notebooks["volcanoes"]})
    assert {hit["parent_id"] for hit in ok(scoped).json()["results"]} == {shared}

    # Writes afterwards. The credential, pointed at a provider again, calls it with the
    # key the release encrypted (the provider refuses any other key).
    credential = fx["credentials"]["compatible"]
    with FakeProviders(host=provider_host, keys={credential["fake_provider"]: credential["api_key"]}) as fake:
        moved = call("PUT", f"/credentials/{credential['id']}", json={"base_url": fake.base_url("openai")})
        assert ok(moved).json()["has_api_key"] is True
        tested = ok(call("POST", f"/credentials/{credential['id']}/test")).json()
        assert tested["success"] is True, tested
        made = call("POST", "/notebooks", json={"name": "After the upgrade", "description": "written by the test"})
        assert made.status_code == 201, made.text
        notebook_id = made.json()["id"]
        source = call(
            "POST",
            "/sources",
            json={
                "type": "text",
                "notebook_id": notebook_id,
                "title": "Seracs",
                "content": "Seracs are towers of glacier ice on a crevassed glacier.",
            },
        )
        assert source.status_code == 201, source.text + worker.log_text()[-2000:]
        assert source.json()["status"] is None and source.json()["embedded"] is True  # done: no job to follow
        assert get(f"/notebooks/{notebook_id}")["source_count"] == 1
        hits = call("POST", "/search", json={"query": "glacier ice valleys", "type": "vector", "minimum_score": 0.1})
        parents = {hit["parent_id"] for hit in ok(hits).json()["results"]}
        # The release's vectors are compared with a new one: the same model, the same blobs.
        assert {source.json()["id"], fx["sources"]["glacier_basics"]} <= parents, parents
        text_hits = call("POST", "/search", json={"query": "seracs", "type": "text"})
        assert [hit["parent_id"] for hit in ok(text_hits).json()["results"]] == [source.json()["id"]]
