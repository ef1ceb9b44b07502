"""Bad inputs and CRUD round trips of the model features (credentials, models,
defaults, transformations, insights, chat, ask, podcasts) against a running
service and worker of their own (small body cap, the fake providers allowed):
every refusal has the right status and a {detail} that names the field, and
changes nothing; the round trips change what they say and remove what they delete.
Also: an encryption key changed between two starts, the default embedding model
used for sources and vector search, and the nginx site's long time-outs."""

import re
import sqlite3

import pytest
import requests

from devtools import nginx
from tests.support.notebook import (
    AUTH,
    ENCRYPTION_KEY,
    LLM_TIMEOUT,
    PROVIDER_HOST,
    credential,
    model,
    notebook_env,
    start_stack,
    stop_stack,
)

MAX_TEXT = 64 * 1024
OTHER_KEY = "QmFkS2V5QmFkS2V5QmFkS2V5QmFkS2V5QmFkS2V5MDA="  # a Fernet key, not ENCRYPTION_KEY


@pytest.fixture(scope="module")
def lnb(tmp_path_factory, fake_providers, link_server):
    client = start_stack(
        tmp_path_factory.mktemp("notebook-llm-inputs") / "data",
        NOTEBOOK_ENCRYPTION_KEY=ENCRYPTION_KEY,
        NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
        NOTEBOOK_LLM_TIMEOUT=str(LLM_TIMEOUT),
        NOTEBOOK_EMBEDDING_PROVIDER="none",
        NOTEBOOK_MAX_TEXT_BYTES=str(MAX_TEXT),
        OPENAI_API_KEY="",
        OPENAI_BASE_URL="",
        ANTHROPIC_API_KEY="",
        OLLAMA_API_BASE="",
    )
    client.fake, client.links = fake_providers, link_server
    yield client
    stop_stack(client)
    fake_providers.reset()  # the fake is the session's: the next module starts with a clean log


@pytest.fixture(scope="module")
def world(lnb):
    """A credential with a language and an embedding model (the language one the
    default chat model), a transformation, a notebook with a processed text source,
    a chat session, and a second credential and transformation (name clashes)."""
    nb = lnb
    cred = credential(nb, "openai", key="sk-good", name="main openai")
    other = credential(nb, "anthropic", key="ant-good", name="main anthropic")
    lang = model(nb, "fake-chat", "openai", cred)
    embed = model(nb, "fake-embed", "openai", cred, kind="embedding")
    assert nb.post("/models/config", json={"default_chat_model": lang["id"]}).status_code == 200
    transformations = [
        nb.post("/transformations", json={"name": name, "prompt": "Summarize."}).json()
        for name in ("summary", "keywords")
    ]
    notebook = nb.notebook("world")
    source = nb.post(
        "/sources",
        json={
            "type": "text",
            "notebook_id": notebook,
            "title": "Glaciers",
            "content": "Glaciers carve valleys. Moraines mark where glaciers ended.",
        },
    )
    assert source.status_code == 201, source.text
    session = nb.post("/chat/sessions", json={"notebook_id": notebook, "title": "s"}).json()
    return {
        "cred": cred["id"],
        "other_cred": other["id"],
        "lang": lang["id"],
        "embed": embed["id"],
        "t": transformations[0]["id"],
        "t2": transformations[1]["id"],
        "notebook": notebook,
        "empty_notebook": nb.notebook("empty"),
        "source": source.json()["id"],
        "session": session["id"],
    }


def state(nb, w):
    """Everything the refused requests could have changed, as the API shows it."""
    return {
        path: nb.get(path).json()
        for path in (
            "/credentials",
            "/models",
            "/models/defaults",
            "/transformations",
            "/chat/sessions",
            f"/chat/sessions/{w['session']}",
            "/podcasts/episodes",
            f"/sources/{w['source']}/insights",
            "/commands?limit=100",
        )
    }


def refused(nb, w, cases):
    """Each (method, path, body, status, field) is answered `status` with a {detail}
    that names `field` (when given), and changes nothing."""
    before = state(nb, w)
    for method, path, body, status, field in cases:
        path, body = _fill(path, w), _fill(body, w)
        response = nb.call(method, path, json=body)
        assert response.status_code == status, (method, path, body, response.status_code, response.text)
        detail = response.json()["detail"]
        assert isinstance(detail, str) and detail, (path, body)
        if field:
            assert field in detail, (path, body, detail)
        assert state(nb, w) == before, (method, path, body)


def _fill(value, w):
    """`{name}` placeholders of the world's ids, in paths and bodies."""
    if isinstance(value, str):
        return re.sub(r"\{(\w+)\}", lambda m: w[m.group(1)], value) if value.count("{") == value.count("}") else value
    if isinstance(value, dict):
        return {_fill(k, w): _fill(v, w) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, w) for v in value]
    return value


# --------------------------------------------------------------------------- credentials


def _base_url_cases(port):
    good = f"http://{PROVIDER_HOST}:{port}/v1"
    urls = [
        f"{good}/../../admin",
        f"{good}/%2e%2e/admin",
        f"{good}/./x",
        f"{good}?debug=1",
        f"{good}#x",
        "file:///etc/passwd",
        "gopher://example.org/",
        "javascript:alert(1)",
        "ftp://example.org/v1",
        "http://127.0.0.1:5055/v1",
        "http://localhost:11434",
        "http://169.254.169.254/latest",
        "http://[::1]:8000/v1",
        "http://[::ffff:127.0.0.1]/v1",
        "http://0.0.0.0/v1",
        "http://10.1.2.3/v1",
        "http://192.168.1.1/v1",
        f"http://user:pw@{PROVIDER_HOST}:{port}/v1",
        "http://2130706433/v1",
        "not a url",
        7,
    ]
    cases = [
        ("POST", "/credentials", {"name": "evil", "provider": "openai_compatible", "base_url": url}, 400, "base_url")
        for url in urls
    ]
    cases += [("PUT", "/credentials/{cred}", {"base_url": url}, 400, "base_url") for url in urls[:12]]
    return cases


def test_credentials_refuse_bad_input(lnb, world):
    nb = lnb
    cases = [
        ("POST", "/credentials", [], 400, "JSON object"),
        ("POST", "/credentials", {"provider": "openai"}, 400, "name"),
        ("POST", "/credentials", {"name": 5, "provider": "openai"}, 400, "name"),
        ("POST", "/credentials", {"name": " ", "provider": "openai"}, 400, "name"),
        ("POST", "/credentials", {"name": "x"}, 400, "provider"),
        ("POST", "/credentials", {"name": "x", "provider": "openia"}, 400, "provider"),
        ("POST", "/credentials", {"name": "x", "provider": ["openai"]}, 400, "provider"),
        ("POST", "/credentials", {"name": "x", "provider": "openai", "colour": "red"}, 400, "colour"),
        ("POST", "/credentials", {"name": "x", "provider": "openai", "api_key": 123}, 400, "api_key"),
        ("POST", "/credentials", {"name": "x", "provider": "openai", "api_key": ""}, 400, "api_key"),
        ("POST", "/credentials", {"name": "x", "provider": "openai_compatible"}, 400, "base_url"),
        ("POST", "/credentials", {"name": "main openai", "provider": "openai"}, 409, "main openai"),
        *_base_url_cases(nb.fake.port),
        ("PUT", "/credentials/{cred}", {}, 400, "give at least one"),
        ("PUT", "/credentials/{cred}", {"provider": "anthropic"}, 400, "provider"),
        ("PUT", "/credentials/{cred}", {"name": ""}, 400, "name"),
        ("PUT", "/credentials/{cred}", {"name": "main anthropic"}, 409, "main anthropic"),
        ("PUT", "/credentials/{cred}", {"api_key": 5}, 400, "api_key"),
        ("PUT", "/credentials/credential:nosuch", {"name": "y"}, 404, "credential:nosuch"),
        ("PUT", "/credentials/model:{cred}", {"name": "y"}, 404, "not found"),
        ("GET", "/credentials/credential:nosuch", None, 404, "credential:nosuch"),
        ("GET", "/credentials/notebook:abc", None, 404, "not found"),
        ("GET", "/credentials/credential:a%2F..", None, 404, None),
        ("GET", "/credentials?provider=openia", None, 400, "provider"),
        ("DELETE", "/credentials/credential:nosuch", None, 404, "credential:nosuch"),
        ("DELETE", "/credentials/{cred}?delete_models=false", None, 409, "used by 2 model(s)"),
        ("DELETE", "/credentials/{cred}?migrate_to=credential:nosuch", None, 404, "migrate_to"),
        ("DELETE", "/credentials/{cred}?migrate_to={other_cred}", None, 400, "not openai"),
        ("DELETE", "/credentials/{cred}?migrate_to={cred}&delete_models=true", None, 400, "not both"),
        ("DELETE", "/credentials/{cred}?force=maybe", None, 400, "force"),
        ("POST", "/credentials/credential:nosuch/test", None, 404, "credential:nosuch"),
        ("POST", "/credentials/credential:nosuch/discover", None, 404, "credential:nosuch"),
        ("POST", "/credentials/{cred}/register-models", {}, 400, "models"),
        ("POST", "/credentials/{cred}/register-models", {"models": []}, 400, "models"),
        ("POST", "/credentials/{cred}/register-models", {"models": "fake-chat"}, 400, "models"),
        (
            "POST",
            "/credentials/{cred}/register-models",
            {"models": [{"name": "x", "type": "video"}]},
            400,
            "models.0.type",
        ),
        ("POST", "/credentials/{cred}/register-models", {"models": [{"type": "language"}]}, 400, "models.0.name"),
        # One bad choice among good ones: none is registered.
        (
            "POST",
            "/credentials/{other_cred}/register-models",
            {"models": [{"name": "claude-fake-1"}, {"name": "claude-embed", "type": "embedding"}]},
            400,
            "embedding",
        ),
        ("POST", "/credentials/credential:nosuch/register-models", {"models": [{"name": "x"}]}, 404, "nosuch"),
    ]
    refused(nb, world, cases)


def test_credential_update_replaces_and_removes_the_key(lnb):
    nb = lnb
    cred = credential(nb, "openai", key="sk-wrong-123456", name="rotating")
    assert nb.post(f"/credentials/{cred['id']}/test").json()["success"] is False
    replaced = nb.put(f"/credentials/{cred['id']}", json={"api_key": "sk-good", "name": "rotated"})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["has_api_key"] is True and replaced.json()["name"] == "rotated"
    nb.fake.reset()
    tested = nb.post(f"/credentials/{cred['id']}/test").json()
    assert tested["success"] is True, tested
    assert nb.fake.seen[-1]["authorization"] == "Bearer sk-good"
    moved = nb.put(f"/credentials/{cred['id']}", json={"base_url": nb.fake.base_url("openai") + "/"})
    assert moved.status_code == 200 and moved.json()["base_url"].endswith("/v1/")
    removed = nb.put(f"/credentials/{cred['id']}", json={"api_key": None})
    assert removed.status_code == 200 and removed.json()["has_api_key"] is False
    with sqlite3.connect(nb.data_dir / "notebook.db") as db:
        (stored,) = db.execute(
            "SELECT api_key_encrypted FROM credential WHERE id = ?", (cred["id"].split(":")[1],)
        ).fetchone()
    assert stored is None
    nb.fake.reset()
    assert nb.post(f"/credentials/{cred['id']}/test").json()["success"] is False  # the fake wants a key
    assert nb.fake.seen[-1]["authorization"] is None
    deleted = nb.delete(f"/credentials/{cred['id']}").json()
    assert (deleted["deleted"], deleted["deleted_models"], deleted["migrated_models"]) == (cred["id"], 0, 0)
    assert nb.get(f"/credentials/{cred['id']}").status_code == 404


@pytest.mark.parametrize("options", ["", "?force=true", "?delete_models=true"])
def test_a_credential_in_use_is_deleted_with_its_models_unless_refused(lnb, options):
    nb = lnb
    cred = credential(nb, "openai", key="sk-good", name=f"doomed{options}")
    used = model(nb, "fake-chat-doomed", "openai", cred)
    defaults = nb.get("/models/defaults").json()
    assert nb.put("/models/defaults", json={"large_context_model": used["id"]}).status_code == 200
    for refusing in ("?delete_models=false", "?force=false"):
        refused_delete = nb.delete(f"/credentials/{cred['id']}{refusing}")
        assert refused_delete.status_code == 409 and "delete_models=true" in refused_delete.json()["detail"]
    assert nb.get(f"/models/{used['id']}").json()["credential"] == cred["id"]
    forced = nb.delete(f"/credentials/{cred['id']}{options}")
    assert forced.status_code == 200, forced.text
    assert (forced.json()["deleted"], forced.json()["deleted_models"]) == (cred["id"], 1)
    assert nb.get(f"/credentials/{cred['id']}").status_code == 404
    assert nb.get(f"/models/{used['id']}").status_code == 404
    assert nb.get("/models/defaults").json() == {**defaults, "large_context_model": None}


def test_a_key_encrypted_with_another_key_is_flagged_not_fatal(start_service, tmp_path, fake_providers):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    extra = {
        "NOTEBOOK_MODEL_HOST_ALLOWLIST": f"{PROVIDER_HOST}/32",
        "NOTEBOOK_EMBEDDING_PROVIDER": "none",
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",
    }
    first = start_service(
        "notebook", data_dir, env=notebook_env(data_dir, NOTEBOOK_ENCRYPTION_KEY=ENCRYPTION_KEY, **extra)
    )
    nb = _Plain(first.base_url)
    cred = nb.post(
        "/credentials",
        json={
            "name": "locked",
            "provider": "openai",
            "api_key": "sk-good",
            "base_url": fake_providers.base_url("openai"),
        },
    ).json()
    keyless = nb.post(
        "/credentials", json={"name": "open", "provider": "ollama", "base_url": fake_providers.base_url("ollama")}
    ).json()
    chat = nb.post(
        "/models", json={"name": "fake-chat", "provider": "openai", "type": "language", "credential": cred["id"]}
    ).json()
    session = nb.post("/chat/sessions", json={"model_override": chat["id"]}).json()
    assert cred["decryption_error"] is None
    first.stop()

    second = start_service("notebook", data_dir, env=notebook_env(data_dir, NOTEBOOK_ENCRYPTION_KEY=OTHER_KEY, **extra))
    nb = _Plain(second.base_url)
    listed = {c["id"]: c for c in nb.get("/credentials").json()}
    assert "another NOTEBOOK_ENCRYPTION_KEY" in listed[cred["id"]]["decryption_error"]
    assert listed[cred["id"]]["has_api_key"] is True
    assert listed[keyless["id"]]["decryption_error"] is None
    assert "cannot be decrypted" in nb.get(f"/credentials/{cred['id']}").json()["decryption_error"]
    tested = nb.post(f"/credentials/{cred['id']}/test")
    assert tested.status_code == 200 and tested.json()["success"] is False
    assert "cannot be decrypted" in tested.json()["message"]
    for response in (
        nb.post(f"/credentials/{cred['id']}/discover"),
        nb.post("/chat/execute", json={"session_id": session["id"], "message": "hi"}),
    ):
        assert response.status_code == 400, response.text
        assert "cannot be decrypted" in response.json()["detail"] and cred["id"] in response.json()["detail"]
    assert nb.get(f"/chat/sessions/{session['id']}").json()["messages"] == []
    stored_again = nb.put(f"/credentials/{cred['id']}", json={"api_key": "sk-good"})
    assert stored_again.status_code == 200 and stored_again.json()["decryption_error"] is None
    assert nb.post(f"/credentials/{cred['id']}/test").json()["success"] is True


class _Plain:
    """A service of a test's own, with the suite's password."""

    def __init__(self, url):
        self.url, self.session = url, requests.Session()
        self.session.headers.update(AUTH)

    def get(self, path, **kwargs):
        return self.session.get(self.url + path, timeout=60, **kwargs)

    def post(self, path, **kwargs):
        return self.session.post(self.url + path, timeout=60, **kwargs)

    def put(self, path, **kwargs):
        return self.session.put(self.url + path, timeout=60, **kwargs)


# --------------------------------------------------------------------------- models, defaults


def test_models_and_defaults_refuse_bad_input(lnb, world):
    cases = [
        ("POST", "/models", {}, 400, None),
        ("POST", "/models", {"provider": "openai", "type": "language"}, 400, "name"),
        ("POST", "/models", {"name": ["m"], "provider": "openai", "type": "language"}, 400, "name"),
        ("POST", "/models", {"name": "m", "provider": "openai", "type": "chat"}, 400, "type"),
        ("POST", "/models", {"name": "m", "provider": "mistral", "type": "language"}, 400, "provider"),
        ("POST", "/models", {"name": "m", "provider": "openai", "type": "language", "size": 7}, 400, "size"),
        ("POST", "/models", {"name": "m", "provider": "anthropic", "type": "embedding"}, 400, "type"),
        (
            "POST",
            "/models",
            {"name": "m", "provider": "openai", "type": "language", "credential": "credential:nosuch"},
            404,
            "credential:nosuch",
        ),
        (
            "POST",
            "/models",
            {"name": "m", "provider": "anthropic", "type": "language", "credential": "{cred}"},
            400,
            "credential",
        ),
        (
            "POST",
            "/models",
            {"name": "fake-chat", "provider": "openai", "type": "language", "credential": "{cred}"},
            409,
            "already registered",
        ),
        ("GET", "/models?type=chat", None, 400, "type"),
        ("GET", "/models?provider=mistral", None, 400, "provider"),
        ("GET", "/models/model:nosuch", None, 404, "model:nosuch"),
        ("GET", "/models/credential:{cred}", None, 404, "not found"),
        ("DELETE", "/models/model:nosuch", None, 404, "model:nosuch"),
    ]
    for path in ("/models/config", "/models/defaults"):
        method = "POST" if path == "/models/config" else "PUT"
        cases += [
            (method, path, {}, 400, "give at least one default"),
            (method, path, [], 400, "JSON object"),
            (method, path, {"default_chat_model": 5}, 400, "default_chat_model"),
            (method, path, {"default_chat_model": ""}, 400, "default_chat_model"),
            (method, path, {"default_fancy_model": "{lang}"}, 400, "default_fancy_model"),
            (method, path, {"default_chat_model": "model:nosuch"}, 404, "default_chat_model"),
            # An id of another kind: 404 like an unknown one, naming the field.
            (method, path, {"default_chat_model": "{t}"}, 404, "default_chat_model"),
            (method, path, {"default_chat_model": "{embed}"}, 400, "default_chat_model"),
            (method, path, {"default_embedding_model": "{lang}"}, 400, "default_embedding_model"),
            # A good default beside a bad one: neither is set.
            (
                method,
                path,
                {"default_transformation_model": "{lang}", "default_text_to_speech_model": "{lang}"},
                400,
                "default_text_to_speech_model",
            ),
        ]
    refused(lnb, world, cases)


# --------------------------------------------------------------------------- transformations, insights


def test_transformations_and_insights_refuse_bad_input(lnb, world):
    cases = [
        ("POST", "/transformations", {}, 400, None),
        ("POST", "/transformations", {"name": "t"}, 400, "prompt"),
        ("POST", "/transformations", {"name": "t", "prompt": ""}, 400, "prompt"),
        ("POST", "/transformations", {"name": "t", "prompt": 7}, 400, "prompt"),
        ("POST", "/transformations", {"name": "x" * 201, "prompt": "p"}, 400, "name"),
        ("POST", "/transformations", {"name": "t", "prompt": "p", "apply_default": "maybe"}, 400, "apply_default"),
        ("POST", "/transformations", {"name": "t", "prompt": "p", "template": "jinja"}, 400, "template"),
        ("POST", "/transformations", {"name": "summary", "prompt": "p"}, 409, "summary"),
        ("GET", "/transformations/transformation:nosuch", None, 404, "transformation:nosuch"),
        ("GET", "/transformations/model:{t}", None, 404, "not found"),
        ("PUT", "/transformations/transformation:nosuch", {"prompt": "p"}, 404, "transformation:nosuch"),
        ("PUT", "/transformations/{t}", {}, 400, "give at least one"),
        ("PUT", "/transformations/{t}", {"name": "keywords"}, 409, "keywords"),
        ("PUT", "/transformations/{t}", {"prompt": None}, 400, "prompt"),
        ("PUT", "/transformations/{t}", {"id": "transformation:other"}, 400, "id"),
        ("DELETE", "/transformations/transformation:nosuch", None, 404, "transformation:nosuch"),
        ("POST", "/transformations/execute", {}, 400, None),
        ("POST", "/transformations/execute", {"transformation_id": "{t}"}, 400, "input_text"),
        ("POST", "/transformations/execute", {"transformation_id": "{t}", "input_text": ""}, 400, "input_text"),
        ("POST", "/transformations/execute", {"transformation_id": "{t}", "input_text": 7}, 400, "input_text"),
        (
            "POST",
            "/transformations/execute",
            {"transformation_id": "transformation:nosuch", "input_text": "x"},
            404,
            "transformation_id",
        ),
        (
            "POST",
            "/transformations/execute",
            {"transformation_id": "{t}", "input_text": "x", "model_id": "model:nosuch"},
            404,
            "model_id",
        ),
        (
            "POST",
            "/transformations/execute",
            {"transformation_id": "{t}", "input_text": "x", "model_id": "{embed}"},
            400,
            "model_id",
        ),
        (
            "POST",
            "/transformations/execute",
            {"transformation_id": "{t}", "input_text": "x", "model_id": 5},
            400,
            "model_id",
        ),
        ("POST", "/sources/source:nosuch/insights", {"transformation_id": "{t}"}, 404, "source:nosuch"),
        ("POST", "/sources/{source}/insights", {}, 400, "transformation_id"),
        (
            "POST",
            "/sources/{source}/insights",
            {"transformation_id": "transformation:nosuch"},
            404,
            "transformation_id",
        ),
        (
            "POST",
            "/sources/{source}/insights",
            {"transformation_id": "{t}", "model_id": "model:nosuch"},
            404,
            "model_id",
        ),
        ("POST", "/sources/{source}/insights", {"transformation_id": "{t}", "model_id": "{embed}"}, 400, "model_id"),
        ("POST", "/sources/{source}/insights", {"transformation_id": "{t}", "prompt": "x"}, 400, "prompt"),
        ("GET", "/sources/source:nosuch/insights", None, 404, "source:nosuch"),
        ("GET", "/insights/insight:nosuch", None, 404, "insight:nosuch"),
        ("GET", "/insights/source:{source}", None, 404, "not found"),
        ("DELETE", "/insights/insight:nosuch", None, 404, "insight:nosuch"),
    ]
    refused(lnb, world, cases)


def test_transformation_and_insight_round_trip(lnb, world):
    nb = lnb
    made = nb.post("/transformations", json={"name": "round trip", "title": "Round", "prompt": "First prompt."})
    assert made.status_code == 201, made.text
    tid = made.json()["id"]
    changed = nb.put(f"/transformations/{tid}", json={"prompt": "Second prompt.", "apply_default": True})
    assert changed.status_code == 200
    assert (changed.json()["prompt"], changed.json()["apply_default"], changed.json()["name"]) == (
        "Second prompt.",
        True,
        "round trip",
    )
    assert nb.get(f"/transformations/{tid}").json()["prompt"] == "Second prompt."
    queued = nb.post(f"/sources/{world['source']}/insights", json={"transformation_id": tid})
    assert queued.status_code == 202, queued.text
    assert nb.wait_command(queued.json()["command_id"])["status"] == "completed"
    (insight,) = [i for i in nb.get(f"/sources/{world['source']}/insights").json() if i["transformation_id"] == tid]
    assert nb.get(f"/insights/{insight['id']}").json()["content"].startswith("Reply from fake-chat")
    assert nb.delete(f"/insights/{insight['id']}").json() == {"deleted": insight["id"]}
    assert nb.get(f"/insights/{insight['id']}").status_code == 404
    assert insight["id"] not in [i["id"] for i in nb.get(f"/sources/{world['source']}/insights").json()]
    assert nb.delete(f"/transformations/{tid}").json() == {"deleted": tid}
    assert nb.get(f"/transformations/{tid}").status_code == 404
    assert tid not in [t["id"] for t in nb.get("/transformations").json()]
    gone = nb.post("/transformations/execute", json={"transformation_id": tid, "input_text": "x"})
    assert gone.status_code == 404 and gone.json()["field"] == "transformation_id"


def test_an_insight_whose_transformation_went_is_canceled_not_left_running(lnb, world):
    """Queued behind a slow job, its transformation deleted before it runs: the
    command ends `canceled` with the reason."""
    nb = lnb
    tid = nb.post("/transformations", json={"name": "short lived", "prompt": "p"}).json()["id"]
    slow = nb.post(
        "/sources",
        json={
            "type": "link",
            "notebook_id": world["empty_notebook"],
            "embed": False,
            "async_processing": True,
            "url": nb.links.base_url + "/slow?seconds=2",
        },
    )
    assert slow.status_code == 202, slow.text
    queued = nb.post(f"/sources/{world['source']}/insights", json={"transformation_id": tid})
    assert queued.status_code == 202
    assert nb.delete(f"/transformations/{tid}").status_code == 200
    command = nb.wait_command(queued.json()["command_id"], deadline=60)
    assert command["status"] == "canceled" and "deleted" in command["error_message"], command
    assert nb.wait_command(slow.json()["command_id"], deadline=60)["status"] == "completed"
    nb.delete(f"/sources/{slow.json()['id']}")


# --------------------------------------------------------------------------- chat, ask


def test_chat_and_ask_refuse_bad_input(lnb, world):
    cases = [
        ("POST", "/chat/sessions", {"notebook_id": "notebook:nosuch"}, 404, "notebook:nosuch"),
        ("POST", "/chat/sessions", {"notebook_id": "source:{source}"}, 404, "not found"),
        ("POST", "/chat/sessions", {"title": 5}, 400, "title"),
        ("POST", "/chat/sessions", {"title": "x" * 501}, 400, "title"),
        ("POST", "/chat/sessions", {"model_override": "model:nosuch"}, 404, "model_override"),
        ("POST", "/chat/sessions", {"model_override": "{embed}"}, 400, "model_override"),
        ("POST", "/chat/sessions", {"messages": []}, 400, "messages"),
        ("GET", "/chat/sessions?notebook_id=notebook:nosuch", None, 404, "notebook:nosuch"),
        ("GET", "/chat/sessions/chat_session:nosuch", None, 404, "chat_session:nosuch"),
        ("GET", "/chat/sessions/notebook:{notebook}", None, 404, "not found"),
        ("PUT", "/chat/sessions/chat_session:nosuch", {"title": "t"}, 404, "chat_session:nosuch"),
        ("PUT", "/chat/sessions/{session}", {}, 400, "give at least one"),
        ("PUT", "/chat/sessions/{session}", {"model_override": "{embed}"}, 400, "model_override"),
        ("PUT", "/chat/sessions/{session}", {"model_override": "model:nosuch"}, 404, "model_override"),
        ("PUT", "/chat/sessions/{session}", {"notebook_id": "{empty_notebook}"}, 400, "notebook_id"),
        ("DELETE", "/chat/sessions/chat_session:nosuch", None, 404, "chat_session:nosuch"),
        ("POST", "/chat/execute", {}, 400, None),
        ("POST", "/chat/execute", {"session_id": "{session}"}, 400, "message"),
        ("POST", "/chat/execute", {"session_id": "{session}", "message": "  "}, 400, "message"),
        ("POST", "/chat/execute", {"session_id": "{session}", "message": ["hi"]}, 400, "message"),
        ("POST", "/chat/execute", {"session_id": "chat_session:nosuch", "message": "hi"}, 404, "chat_session:nosuch"),
        (
            "POST",
            "/chat/execute",
            {"session_id": "{session}", "message": "hi", "model_override": "model:nosuch"},
            404,
            "model_override",
        ),
        (
            "POST",
            "/chat/execute",
            {"session_id": "{session}", "message": "hi", "model_override": "{embed}"},
            400,
            "model_override",
        ),
        ("POST", "/chat/execute", {"session_id": "{session}", "message": "hi", "stream": "maybe"}, 400, "stream"),
        (
            "POST",
            "/chat/execute",
            {"session_id": "{session}", "message": "hi", "context": "everything"},
            400,
            "context",
        ),
        (
            "POST",
            "/chat/execute",
            {"session_id": "{session}", "message": "hi", "context": {"sources": [{"id": "source:x", "title": "t"}]}},
            400,
            "context.sources.0.content",
        ),
        ("POST", "/chat/execute", {"session_id": "{session}", "message": "hi", "temperature": 2}, 400, "temperature"),
        ("POST", "/ask", {}, 400, "question"),
        ("POST", "/ask", {"question": ""}, 400, "question"),
        ("POST", "/ask", {"question": 5}, 400, "question"),
        ("POST", "/ask", {"question": "why?", "notebook_id": "notebook:nosuch"}, 404, "notebook:nosuch"),
        ("POST", "/ask", {"question": "why?", "strategy_model": "model:nosuch"}, 404, "strategy_model"),
        ("POST", "/ask", {"question": "why?", "answer_model": "{embed}"}, 400, "answer_model"),
        ("POST", "/ask", {"question": "why?", "final_answer_model": "{cred}"}, 404, "final_answer_model"),
        ("POST", "/ask", {"question": "why?", "model": "{lang}"}, 400, "model"),
    ]
    for path in ("/chat/context/build", "/chat/context"):
        cases += [
            ("POST", path, {}, 400, "notebook_id"),
            ("POST", path, {"notebook_id": "notebook:nosuch"}, 404, "notebook:nosuch"),
            (
                "POST",
                path,
                {"notebook_id": "{notebook}", "context_config": {"sources": {"{source}": "everything"}}},
                400,
                "context_config.sources",
            ),
            (
                "POST",
                path,
                {"notebook_id": "{notebook}", "context_config": {"sources": []}},
                400,
                "context_config.sources",
            ),
            (
                "POST",
                path,
                {"notebook_id": "{notebook}", "context_config": {"videos": {}}},
                400,
                "context_config.videos",
            ),
            ("POST", path, {"notebook_id": "{notebook}", "context_config": "all"}, 400, "context_config"),
        ]
    refused(lnb, world, cases)


def test_chat_session_round_trip(lnb, world):
    nb = lnb
    made = nb.post("/chat/sessions", json={"notebook_id": world["notebook"], "title": "first"})
    assert made.status_code == 201
    sid = made.json()["id"]
    reply = nb.post("/chat/execute", json={"session_id": sid, "message": "What carves valleys?"})
    assert reply.status_code == 200, reply.text
    assert [m["type"] for m in reply.json()["messages"]] == ["human", "ai"]
    changed = nb.put(f"/chat/sessions/{sid}", json={"title": "second", "model_override": world["lang"]})
    assert changed.status_code == 200
    assert (changed.json()["title"], changed.json()["model_override"], changed.json()["message_count"]) == (
        "second",
        world["lang"],
        2,
    )
    cleared = nb.put(f"/chat/sessions/{sid}", json={"model_override": None})
    assert cleared.json()["model_override"] is None and cleared.json()["title"] == "second"
    assert nb.get(f"/chat/sessions/{sid}").json()["title"] == "second"
    assert nb.delete(f"/chat/sessions/{sid}").json() == {"deleted": sid}
    assert nb.get(f"/chat/sessions/{sid}").status_code == 404
    assert sid not in [s["id"] for s in nb.get("/chat/sessions").json()]
    with sqlite3.connect(nb.data_dir / "notebook.db") as db:
        (left,) = db.execute("SELECT COUNT(*) FROM chatmessage WHERE session_id = ?", (sid.split(":")[1],)).fetchone()
    assert left == 0


# --------------------------------------------------------------------------- podcasts


def test_podcasts_refuse_bad_input(lnb, world):
    base = {"notebook_id": "{notebook}", "episode_name": "e"}
    cases = [
        ("POST", "/podcasts/generate", {}, 400, None),
        ("POST", "/podcasts/generate", {"notebook_id": "{notebook}"}, 400, "episode_name"),
        ("POST", "/podcasts/generate", {**base, "episode_name": ""}, 400, "episode_name"),
        ("POST", "/podcasts/generate", {**base, "speakers": "2"}, 400, "speakers"),
        ("POST", "/podcasts/generate", {**base, "speakers": 0}, 400, "speakers"),
        ("POST", "/podcasts/generate", {**base, "speakers": 5}, 400, "speakers"),
        ("POST", "/podcasts/generate", {**base, "speakers": 2.5}, 400, "speakers"),
        ("POST", "/podcasts/generate", {**base, "length": "epic"}, 400, "length"),
        ("POST", "/podcasts/generate", {**base, "voice": "x"}, 400, "voice"),
        ("POST", "/podcasts/generate", {**base, "notebook_id": "notebook:nosuch"}, 404, "notebook:nosuch"),
        ("POST", "/podcasts/generate", {**base, "model_id": "model:nosuch"}, 404, "model_id"),
        ("POST", "/podcasts/generate", {**base, "model_id": "{embed}"}, 400, "model_id"),
        ("POST", "/podcasts/generate", {**base, "notebook_id": "{empty_notebook}"}, 400, "no sources or notes"),
        ("GET", "/podcasts/episodes/episode:nosuch", None, 404, "episode:nosuch"),
        ("GET", "/podcasts/episodes/notebook:{notebook}", None, 404, "not found"),
        ("GET", "/podcasts/episodes/episode:nosuch/audio", None, 404, "episode:nosuch"),
        ("DELETE", "/podcasts/episodes/episode:nosuch", None, 404, "episode:nosuch"),
    ]
    refused(lnb, world, cases)


def test_podcast_episode_round_trip(lnb, world):
    nb = lnb
    queued = nb.post(
        "/podcasts/generate",
        json={"notebook_id": world["notebook"], "episode_name": "Solo", "speakers": 1, "model_id": world["lang"]},
    )
    assert queued.status_code == 202, queued.text
    assert queued.json()["model_id"] == world["lang"]
    assert nb.wait_command(queued.json()["command_id"])["status"] == "completed"
    eid = queued.json()["episode_id"]
    episode = nb.get(f"/podcasts/episodes/{eid}").json()
    assert (episode["name"], episode["job_status"], episode["audio_available"]) == ("Solo", "completed", True)
    assert {t["speaker"] for t in episode["transcript"]} == {"Alex"}
    audio = nb.get(f"/podcasts/episodes/{eid}/audio")
    assert audio.status_code == 200 and audio.headers["Content-Type"] == "audio/mpeg"
    data = audio.content
    if data.startswith(b"ID3"):
        data = data[10 + int.from_bytes(data[6:10], "big") :]
    assert data[0] == 0xFF and data[1] & 0xE0 == 0xE0, data[:4]  # an MPEG audio frame's sync bits
    stored = nb.data_dir / "podcasts" / f"{eid.split(':')[1]}.mp3"
    assert stored.read_bytes() == audio.content
    assert nb.delete(f"/podcasts/episodes/{eid}").json() == {"deleted": eid}
    assert not stored.exists() and not list((nb.data_dir / "podcasts").glob("*.part"))
    assert nb.get(f"/podcasts/episodes/{eid}").status_code == 404
    assert nb.get(f"/podcasts/episodes/{eid}/audio").status_code == 404
    assert eid not in [e["id"] for e in nb.get("/podcasts/episodes").json()]


# --------------------------------------------------------------------------- bodies

WRITES = [
    ("POST", "/credentials"),
    ("PUT", "/credentials/{cred}"),
    ("POST", "/credentials/{cred}/register-models"),
    ("POST", "/models"),
    ("POST", "/models/config"),
    ("PUT", "/models/defaults"),
    ("POST", "/transformations"),
    ("PUT", "/transformations/{t}"),
    ("POST", "/transformations/execute"),
    ("POST", "/sources/{source}/insights"),
    ("POST", "/chat/sessions"),
    ("PUT", "/chat/sessions/{session}"),
    ("POST", "/chat/context/build"),
    ("POST", "/chat/context"),
    ("POST", "/chat/execute"),
    ("POST", "/ask"),
    ("POST", "/podcasts/generate"),
]


def test_huge_and_non_json_bodies(lnb, world):
    nb = lnb
    before = state(nb, world)
    huge = b'{"name": "' + b"x" * (MAX_TEXT + 1) + b'"}'
    for method, path in WRITES:
        path = _fill(path, world)
        response = nb.call(method, path, data=huge, headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and response.json()["detail"], (path, response.text)
        response = nb.call(method, path, data=b"name=x", headers={"Content-Type": "text/plain"})
        assert response.status_code == 415 and "JSON" in response.json()["detail"], path
        response = nb.call(method, path, data=b'{"name": ', headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and "not valid JSON" in response.json()["detail"], path
    assert state(nb, world) == before


# --------------------------------------------------------------------------- the default embedding model


def test_the_default_embedding_model_embeds_sources_and_queries(lnb, world):
    nb = lnb
    off = nb.post("/search", json={"query": "glaciers", "type": "vector"})
    assert off.status_code == 400 and "embedding model" in off.json()["detail"]
    assert nb.post("/models/config", json={"default_embedding_model": world["embed"]}).status_code == 200
    try:
        nb.fake.reset()
        notebook = nb.notebook("vectors")
        added = nb.post(
            "/sources",
            json={
                "type": "text",
                "notebook_id": notebook,
                "title": "Tides",
                "content": "The moon pulls the ocean into tides twice a day.",
            },
        )
        assert added.status_code == 201, added.text
        assert added.json()["embedded_chunks"] == 1
        command_id = nb.get(f"/sources/{added.json()['id']}").json()["command_id"]
        result = nb.get(f"/commands/{command_id}").json()["result"]
        assert result["embedding_model"] == "openai/fake-embed"
        (sent,) = nb.fake.requests_to("/v1/embeddings")
        assert sent["body"]["model"] == "fake-embed" and sent["authorization"] == "Bearer sk-good"
        assert "moon pulls the ocean" in sent["body"]["input"][0]
        hits = nb.post("/search", json={"query": "ocean tides and the moon", "type": "vector", "notebook_id": notebook})
        assert hits.status_code == 200, hits.text
        assert [h["id"] for h in hits.json()["results"]] == [added.json()["id"]]
        queries = nb.fake.requests_to("/v1/embeddings")
        assert len(queries) == 2 and queries[-1]["body"]["input"] == ["ocean tides and the moon"]
        nb.fake.mode = "429"  # the model is there, its provider refuses: not "no model"
        limited = nb.post("/search", json={"query": "tides", "type": "vector"})
        assert limited.status_code == 503 and "rate limiting" in limited.json()["detail"], limited.text
    finally:
        nb.fake.mode = None
        assert nb.post("/models/config", json={"default_embedding_model": None}).status_code == 200
    again = nb.post("/search", json={"query": "tides", "type": "vector"})
    assert again.status_code == 400 and "embedding model" in again.json()["detail"]


# --------------------------------------------------------------------------- nginx

LONG_ROUTES = [
    "/transformations/execute",
    "/podcasts/generate",
    "/chat/context",
    "/chat/context/build",
    "/chat/execute",
    "/ask",
    "/search/ask",
    "/search/ask/simple",
    "/search",
    "/sources",
    "/sources/source:abc/insights",
    "/sources/source:abc/chat/sessions/chat_session:def/messages",
    "/notebooks/notebook:abc/context",
    "/podcasts/episodes/episode:abc/retry",
    "/embed",
    "/embeddings/rebuild",
    "/rebuild",
    "/models/model:abc/test",
]


def test_nginx_gives_model_routes_a_long_time_out(tmp_path):
    """The first regex location that matches (nginx's rule) has a read time-out of
    minutes, at the spec's path and under /api."""
    nginx.render(tmp_path, nginx.variables_for(8080, {"notebook": "127.0.0.1:5055"}))
    site = (tmp_path / "sites" / "notebook.conf").read_text()
    snippets = {p.name: p.read_text() for p in (tmp_path / "snippets").glob("*.conf")}
    locations = []
    for pattern, block in re.findall(r"location ~ (\S+) \{(.*?)\n    \}", site, re.S):
        for name in re.findall(r"include \S+/(\S+);", block):
            block += snippets[name]
        timeout = re.search(r"proxy_read_timeout (\d+)([smh])", block)
        seconds = int(timeout.group(1)) * {"s": 1, "m": 60, "h": 3600}[timeout.group(2)] if timeout else 60
        locations.append((re.compile(pattern), seconds))
    for route in LONG_ROUTES:
        for path in (route, "/api" + route):
            seconds = next((s for regex, s in locations if regex.search(path)), 60)
            assert seconds >= 600, path
    assert next((s for regex, s in locations if regex.search("/notebooks")), 60) == 60
