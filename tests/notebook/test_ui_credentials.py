"""Open Notebook's UI (its settings pages, the banner on every page) and onb-mcp
against our credentials, providers and models: their calls, under /api, with their
bodies, checking the fields they read (lfnovo/open-notebook frontend/src/lib/api/
credentials.ts, providers.ts, capabilities.ts, models.ts; onb_mcp/tools/credentials.py),
and their bad inputs answered 400/404 naming the field, with nothing changed."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.notebook import PROVIDER_HOST, llm_stack, stop_stack

PROVIDERS = ["openai", "anthropic", "ollama", "openai_compatible"]


def created(response):
    assert response.status_code == 201, response.text
    return response.json()


def ok(response):
    assert response.status_code == 200, response.text
    return response.json()


def ollama_credential(nb, name):
    """The credential dialog's body for Ollama (modalities from /providers, num_ctx typed in)."""
    info = next(p for p in ok(nb.get("/api/providers")) if p["name"] == "ollama")
    body = {
        "name": name,
        "provider": "ollama",
        "modalities": info["modalities"],
        "base_url": nb.fake.base_url("ollama"),
        "num_ctx": 8192,
    }
    return created(nb.post("/api/credentials", json=body))


@pytest.fixture
def kept_defaults(llm_nb):
    """The defaults as they were, put back however the test ends (the stack is shared)."""
    before = ok(llm_nb.get("/api/models/defaults"))
    yield before
    ok(llm_nb.put("/api/models/defaults", json=before))


@pytest.fixture(scope="module")
def bare_nb(tmp_path_factory, fake_providers):
    """A stack of this module's own (SQLite: the rule is the same on both databases),
    where anthropic and openai_compatible have no credential: by the time this module
    runs, the shared stack has a credential of every provider."""
    client = llm_stack(tmp_path_factory, fake_providers, "sqlite")
    yield client
    stop_stack(client)


def unconfigured_provider(nb):
    """A provider with no credential and no environment."""
    status = ok(nb.get("/api/credentials/status"))
    free = [p for p in ("anthropic", "openai_compatible") if not status["configured"][p]]
    assert free, status
    return free[0]


def state(nb):
    """What a refused call must leave as it was."""
    return (
        ok(nb.get("/api/credentials")),
        sorted((m["id"], m["credential"]) for m in ok(nb.get("/api/models"))),
        ok(nb.get("/api/models/defaults")),
    )


# --------------------------------------------------------------------------- every page


def test_the_banner_and_the_settings_page_read_status_and_env_status(llm_nb):
    nb = llm_nb
    status = ok(nb.get("/api/credentials/status"))
    env = ok(nb.get("/api/credentials/env-status"))
    assert status["encryption_configured"] is True
    # SetupBanner: `for (provider in envStatus) if (envStatus[p] && status.source[p] === 'environment')`.
    assert env == {"openai": True, "anthropic": False, "ollama": False, "openai_compatible": False}
    for provider in PROVIDERS:
        assert status["source"][provider] in ("database", "environment", "none")
        assert status["configured"][provider] is (status["source"][provider] != "none")
    cred = ollama_credential(nb, "status check")
    after = ok(nb.get("/api/credentials/status"))
    assert (after["configured"]["ollama"], after["source"]["ollama"]) == (True, "database")
    assert after["providers"]["ollama"]["credentials"] >= 1  # our own detail, kept alongside
    ok(nb.delete(f"/api/credentials/{cred['id']}"))


def test_providers_and_capabilities(llm_nb):
    nb = llm_nb
    providers = ok(nb.get("/api/providers"))
    assert [p["name"] for p in providers] == PROVIDERS
    by_name = {p["name"]: p for p in providers}
    assert by_name["openai"]["display_name"] == "OpenAI" and by_name["openai"]["env_configured"] is True
    assert by_name["openai"]["docs_url"].startswith("https://")
    assert by_name["anthropic"]["modalities"] == ["language"] and by_name["anthropic"]["env_configured"] is False
    assert by_name["ollama"]["modalities"] == ["language", "embedding"]
    assert len(by_name["openai_compatible"]["modalities"]) == 4
    assert ok(nb.get("/api/capabilities")) == {
        "docling_available": False,
        "crawl4ai_available": False,
        "crawl4ai_remote_configured": False,
    }


# --------------------------------------------------------------------------- the credential journey


def test_configure_discover_register_default_test_and_delete(llm_nb, kept_defaults):
    nb = llm_nb
    cred = ollama_credential(nb, "ui ollama")
    for field in ("id", "name", "provider", "modalities", "has_api_key", "model_count", "created", "updated"):
        assert field in cred
    assert (cred["provider"], cred["modalities"], cred["model_count"]) == ("ollama", ["language", "embedding"], 0)
    assert cred["num_ctx"] == 8192  # the edit form shows it again
    # The edit form sends only what changed.
    edited = ok(nb.put(f"/api/credentials/{cred['id']}", json={"name": "ui ollama 2", "num_ctx": 4096}))
    assert (edited["name"], edited["num_ctx"]) == ("ui ollama 2", 4096)

    found = ok(nb.post(f"/api/credentials/{cred['id']}/discover"))
    assert found["credential_id"] == cred["id"] and found["provider"] == "ollama"
    assert [(m["name"], m["provider"]) for m in found["discovered"]] == [
        ("llama-fake:latest", "ollama"),
        ("nomic-fake:latest", "ollama"),
    ]
    assert [m["model_type"] for m in found["discovered"]] == ["language", "embedding"]

    # The dialog registers the ticked models with the one type chosen above them.
    def register(names, kind):
        models = [{"name": n, "provider": "ollama", "model_type": kind} for n in names]
        return ok(nb.post(f"/api/credentials/{cred['id']}/register-models", json={"models": models}))

    first = register(["llama-fake:latest"], "language")
    assert (first["created"], first["existing"]) == (1, 0)
    assert (register(["nomic-fake:latest"], "embedding")["created"]) == 1
    again = register(["llama-fake:latest"], "language")
    assert (again["created"], again["existing"]) == (0, 1)
    mine = {m["name"]: m for m in ok(nb.get("/api/models")) if m["credential"] == cred["id"]}
    assert {name: m["type"] for name, m in mine.items()} == {
        "llama-fake:latest": "language",
        "nomic-fake:latest": "embedding",
    }
    assert ok(nb.get(f"/api/credentials/{cred['id']}"))["model_count"] == 2

    # Auto-assign fills the empty chat and embedding defaults, preferring OpenAI's models.
    ok(nb.put("/api/models/defaults", json={"default_chat_model": None, "default_embedding_model": None}))
    assigned = ok(nb.post("/api/models/auto-assign"))
    assert set(assigned["assigned"]) == {"default_chat_model", "default_embedding_model"}
    assert assigned["missing"] == [] and assigned["skipped"] == []
    registered = {m["id"]: m for m in ok(nb.get("/api/models"))}
    for key, kind in (("default_chat_model", "language"), ("default_embedding_model", "embedding")):
        chosen = registered[assigned["assigned"][key]]
        candidates = [m for m in registered.values() if m["type"] == kind]
        best_rank = min(PROVIDERS.index(m["provider"]) for m in candidates)
        assert chosen["type"] == kind and PROVIDERS.index(chosen["provider"]) == best_rank
    defaults = ok(nb.get("/api/models/defaults"))
    assert defaults["default_chat_model"] == assigned["assigned"]["default_chat_model"]
    twice = ok(nb.post("/api/models/auto-assign"))
    assert twice == {"assigned": {}, "skipped": ["default_chat_model", "default_embedding_model"], "missing": []}

    # A model's test is a real call through its credential.
    nb.fake.reset()
    tested = ok(nb.post(f"/api/models/{mine['llama-fake:latest']['id']}/test"))
    assert tested["success"] is True and tested["message"].startswith("Response: Reply from llama-fake:latest")
    [chat] = [r for r in nb.fake.seen if r["path"] == "/ollama/api/chat"]
    assert chat["body"]["options"] == {"num_ctx": 4096}  # the credential's context window
    tested = ok(nb.post(f"/api/models/{mine['nomic-fake:latest']['id']}/test"))
    assert tested["success"] is True and tested["message"].startswith("Embedding dimensions: ")
    # An emptied num_ctx is sent as 0: the server's default again, no options sent.
    assert ok(nb.put(f"/api/credentials/{cred['id']}", json={"num_ctx": 0}))["num_ctx"] is None
    nb.fake.reset()
    ok(nb.post(f"/api/models/{mine['llama-fake:latest']['id']}/test"))
    [chat] = [r for r in nb.fake.seen if r["path"] == "/ollama/api/chat"]
    assert "options" not in chat["body"]

    # Delete: "Migrate & Delete" moves the models to another credential of the provider ...
    other = ollama_credential(nb, "ui ollama other")
    moved = ok(nb.delete(f"/api/credentials/{cred['id']}", params={"migrate_to": other["id"]}))
    assert moved["deleted_models"] == 0 and moved["message"]
    assert nb.get(f"/api/credentials/{cred['id']}").status_code == 404
    assert {m["credential"] for m in ok(nb.get("/api/models")) if m["id"] in {v["id"] for v in mine.values()}} == {
        other["id"]
    }
    # ... and "Delete with Models" deletes them with it.
    ok(nb.put("/api/models/defaults", json={"large_context_model": mine["llama-fake:latest"]["id"]}))
    gone = ok(nb.delete(f"/api/credentials/{other['id']}", params={"delete_models": "true"}))
    assert gone["deleted_models"] == 2 and gone["message"]
    for model in mine.values():
        assert nb.get(f"/api/models/{model['id']}").status_code == 404
    assert ok(nb.get("/api/models/defaults"))["large_context_model"] is None


def test_onb_mcp_registers_without_a_body_every_listed_model(llm_nb):
    nb = llm_nb
    cred = created(
        nb.post(
            "/api/credentials",
            json={"name": "mcp openai", "provider": "openai", "api_key": "sk-good", "base_url": nb.fake.base_url()},
        )
    )
    first = ok(nb.post(f"/api/credentials/{cred['id']}/register-models"))  # no body, as onb-mcp posts it
    assert (first["created"], first["existing"]) == (3, 0)
    types = {m["name"]: m["type"] for m in ok(nb.get("/api/models")) if m["credential"] == cred["id"]}
    assert types == {"fake-chat": "language", "fake-embed": "embedding", "fake-tts": "text_to_speech"}
    again = ok(nb.post(f"/api/credentials/{cred['id']}/register-models"))
    assert (again["created"], again["existing"]) == (0, 3)
    # Its discover_models returns the answer whole: `discovered` is in it.
    assert [m["registered"] for m in ok(nb.post(f"/api/credentials/{cred['id']}/discover"))["discovered"]] == [True] * 3
    speech = next(m for m in ok(nb.get("/api/models")) if m["credential"] == cred["id"] and m["name"] == "fake-tts")
    tested = ok(nb.post(f"/api/models/{speech['id']}/test"))
    assert tested["success"] is True and tested["message"].startswith("Audio generated: ")
    assert ok(nb.delete(f"/api/credentials/{cred['id']}"))["deleted_models"] == 3  # the UI's plain delete


def test_a_model_test_says_when_its_provider_is_not_configured_or_fails(bare_nb):
    nb = bare_nb
    provider = unconfigured_provider(nb)
    lonely = created(nb.post("/api/models", json={"name": "x-chat", "provider": provider, "type": "language"}))
    nb.fake.reset()
    tested = ok(nb.post(f"/api/models/{lonely['id']}/test"))
    assert tested["success"] is False and f"{provider} is not configured" in tested["message"]
    assert not nb.fake.seen
    ok(nb.delete(f"/api/models/{lonely['id']}"))

    cred = created(
        nb.post(
            "/api/credentials",
            json={
                "name": "bad key",
                "provider": "openai",
                "api_key": "sk-wrong-987654",
                "base_url": nb.fake.base_url(),
            },
        )
    )
    bad = created(
        nb.post(
            "/api/models",
            json={"name": "fake-chat", "provider": "openai", "type": "language", "credential": cred["id"]},
        )
    )
    tested = ok(nb.post(f"/api/models/{bad['id']}/test"))
    assert tested["success"] is False and "rejected the API key" in tested["message"]
    assert "sk-wrong" not in tested["message"]
    closed = created(
        nb.post(
            "/api/credentials",
            json={"name": "closed", "provider": "openai_compatible", "base_url": f"http://{PROVIDER_HOST}:9/v1"},
        )
    )
    unreachable = ok(nb.post(f"/api/credentials/{closed['id']}/register-models", json={"models": [{"name": "m"}]}))
    model_id = unreachable["models"][0]["id"]
    tested = ok(nb.post(f"/api/models/{model_id}/test"))
    assert tested["success"] is False and "could not be reached" in tested["message"]
    for each in (cred, closed):
        ok(nb.delete(f"/api/credentials/{each['id']}"))


def test_auto_assign_passes_over_a_model_whose_provider_cannot_be_called(bare_nb):
    nb = bare_nb
    provider = unconfigured_provider(nb)
    unusable = created(nb.post("/api/models", json={"name": "aaa-nobody", "provider": provider, "type": "language"}))
    cred = ollama_credential(nb, "auto-assign ollama")
    try:
        registered = ok(
            nb.post(
                f"/api/credentials/{cred['id']}/register-models",
                json={"models": [{"name": "llama-fake:latest", "provider": "ollama", "model_type": "language"}]},
            )
        )
        ok(nb.put("/api/models/defaults", json={"default_chat_model": None}))
        chosen = ok(nb.post("/api/models/auto-assign"))["assigned"]["default_chat_model"]
        assert chosen != unusable["id"]
        if provider == "anthropic" and not ok(nb.get("/api/models", params={"provider": "openai"})):
            assert chosen == registered["models"][0]["id"]  # ranked below the unusable one, chosen
        tested = ok(nb.post(f"/api/models/{chosen}/test"))
        assert "not configured" not in tested["message"]
    finally:
        ok(nb.delete(f"/api/models/{unusable['id']}"))
        ok(nb.delete(f"/api/credentials/{cred['id']}"))


# --------------------------------------------------------------------------- delete and migrate_to


def credential_with_models(nb, name, models):
    cred = ollama_credential(nb, name)
    choices = [{"name": n, "provider": "ollama", "model_type": kind} for n, kind in models]
    ok(nb.post(f"/api/credentials/{cred['id']}/register-models", json={"models": choices}))
    return cred


def test_migrate_to_a_credential_deleted_before_is_404_and_changes_nothing(llm_nb):
    nb = llm_nb
    first = credential_with_models(nb, "crossed a", [("llama-fake:latest", "language")])
    second = credential_with_models(nb, "crossed b", [("nomic-fake:latest", "embedding")])
    ok(nb.delete(f"/api/credentials/{second['id']}", params={"migrate_to": first["id"]}))
    before = state(nb)
    refused = nb.delete(f"/api/credentials/{first['id']}", params={"migrate_to": second["id"]})
    assert refused.status_code == 404 and refused.json()["field"] == "migrate_to", refused.text
    assert state(nb) == before
    assert ok(nb.get(f"/api/credentials/{first['id']}"))["model_count"] == 2
    ok(nb.delete(f"/api/credentials/{first['id']}"))


def test_crossed_deletes_at_once_answer_200_and_404_never_500(llm_nb):
    """Two deletes, each moving its models to the other: the first to write wins, the
    second finds its target gone (404 on migrate_to), whichever order they meet in."""
    nb = llm_nb
    for round_ in range(4):
        pair = [
            credential_with_models(nb, f"race {round_} a", [("llama-fake:latest", "language")]),
            credential_with_models(nb, f"race {round_} b", [("nomic-fake:latest", "embedding")]),
        ]
        start = threading.Barrier(2)

        def delete(one, other, start=start):
            start.wait(timeout=30)
            return nb.delete(f"/api/credentials/{one['id']}", params={"migrate_to": other["id"]})

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(delete, pair, reversed(pair)))
        assert sorted(a.status_code for a in answers) == [200, 404], [a.text for a in answers]
        [kept] = [cred for cred, answer in zip(reversed(pair), answers, strict=True) if answer.status_code == 200]
        assert ok(nb.get(f"/api/credentials/{kept['id']}"))["model_count"] == 2
        ok(nb.delete(f"/api/credentials/{kept['id']}"))


def test_migrate_to_merges_a_model_the_target_has_already(llm_nb, kept_defaults):
    nb = llm_nb
    both = [("llama-fake:latest", "language")]
    moving = credential_with_models(nb, "merge from", [*both, ("nomic-fake:latest", "embedding")])
    target = credential_with_models(nb, "merge into", both)
    models = ok(nb.get("/api/models", params={"provider": "ollama"}))
    [moved_copy] = [m for m in models if m["credential"] == moving["id"] and m["type"] == "language"]
    [existing] = [m for m in models if m["credential"] == target["id"]]
    ok(nb.put("/api/models/defaults", json={"large_context_model": moved_copy["id"]}))
    answer = ok(nb.delete(f"/api/credentials/{moving['id']}", params={"migrate_to": target["id"]}))
    assert (answer["migrated_models"], answer["merged_models"], answer["deleted_models"]) == (2, 1, 0)
    assert nb.get(f"/api/models/{moved_copy['id']}").status_code == 404
    assert ok(nb.get("/api/models/defaults"))["large_context_model"] == existing["id"]
    under_target = [m for m in ok(nb.get("/api/models")) if m["credential"] == target["id"]]
    assert sorted((m["name"], m["type"]) for m in under_target) == [
        ("llama-fake:latest", "language"),
        ("nomic-fake:latest", "embedding"),
    ]
    ok(nb.delete(f"/api/credentials/{target['id']}"))


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("method", "path", "payload", "status", "named"),
    [
        ("POST", "/api/credentials", {"name": "n", "provider": "ollama", "num_ctx": "8192"}, 400, "num_ctx"),
        ("POST", "/api/credentials", {"name": "n", "provider": "ollama", "num_ctx": -1}, 400, "num_ctx"),
        ("POST", "/api/credentials", {"name": "n", "provider": "ollama", "temperature": 1}, 400, "temperature"),
        ("POST", "/api/credentials", {"name": "n", "provider": "anthropic", "num_ctx": 8192}, 400, "num_ctx"),
        ("PUT", "/api/credentials/{anthropic}", {"num_ctx": 8192}, 400, "num_ctx"),
        ("POST", "/api/credentials", {"name": "n", "provider": "vertex", "project": "p"}, 400, "provider"),
        ("POST", "/api/credentials", {"name": "n", "provider": "ollama", "modalities": ["video"]}, 400, "modalities"),
        ("PUT", "/api/credentials/{cred}", {"num_ctx": 1.5}, 400, "num_ctx"),
        ("PUT", "/api/credentials/{cred}", {"endpoint": 5}, 400, "endpoint"),
        ("PUT", "/api/credentials/{cred}", {"colour": "red"}, 400, "colour"),
        ("PUT", "/api/credentials/credential:nosuch", {"name": "x"}, 404, "credential:nosuch"),
        ("POST", "/api/credentials/credential:nosuch/discover", None, 404, "credential:nosuch"),
        ("POST", "/api/credentials/credential:nosuch/register-models", None, 404, "credential:nosuch"),
        ("POST", "/api/credentials/credential:nosuch/test", None, 404, "credential:nosuch"),
        ("POST", "/api/models/model:nosuch/test", None, 404, "model:nosuch"),
        ("POST", "/api/models/credential:{bare}/test", None, 404, "not found"),
        (
            "POST",
            "/api/credentials/{cred}/register-models",
            {"models": [{"name": "m", "provider": "ollama", "model_type": "video"}]},
            400,
            "models.0.model_type",
        ),
        (
            "POST",
            "/api/credentials/{cred}/register-models",
            {"models": [{"name": "m", "provider": "anthropic", "model_type": "language"}]},
            400,
            "models.0.provider",
        ),
        (
            "POST",
            "/api/credentials/{cred}/register-models",
            {"models": [{"name": "m", "provider": "ollama", "model_type": "text_to_speech"}]},
            400,
            "text_to_speech",
        ),
        (
            "POST",
            "/api/credentials/{cred}/register-models",
            {"models": [{"name": "m", "type": "language", "model_type": "embedding"}]},
            400,
            "models.0.model_type",
        ),
        ("POST", "/api/credentials/{cred}/register-models", {"models": [{"name": 5}]}, 400, "models.0.name"),
        (
            "POST",
            "/api/credentials/{cred}/register-models",
            {"models": [{"name": "m", "model_type": "language", "size": 1}]},
            400,
            "models.0.size",
        ),
        ("POST", "/api/credentials/{cred}/register-models", {}, 400, "models"),
        ("DELETE", "/api/credentials/{cred}?delete_models=maybe", None, 400, "delete_models"),
        ("DELETE", "/api/credentials/{cred}?migrate_to=credential:nosuch", None, 404, "migrate_to"),
        ("DELETE", "/api/credentials/{cred}?migrate_to={cred}", None, 400, "migrate_to"),
        ("DELETE", "/api/credentials/{cred}?migrate_to={anthropic}", None, 400, "not ollama"),
        ("DELETE", "/api/credentials/{cred}?delete_models=false", None, 409, "delete_models=true"),
    ],
)
def test_bad_inputs_are_refused_and_change_nothing(llm_nb, method, path, payload, status, named):
    nb = llm_nb
    cred = ollama_credential(nb, f"bad inputs {method} {path}")
    ok(
        nb.post(
            f"/api/credentials/{cred['id']}/register-models",
            json={"models": [{"name": "llama-fake:latest", "provider": "ollama", "model_type": "language"}]},
        )
    )
    anthropic = created(nb.post("/api/credentials", json={"name": f"a {method} {path}", "provider": "anthropic"}))
    before = state(nb)
    filled = path.format(cred=cred["id"], bare=cred["id"].split(":")[1], anthropic=anthropic["id"])
    response = nb.call(method, filled, **({} if payload is None else {"json": payload}))
    assert response.status_code == status, response.text
    assert named in response.text
    assert state(nb) == before
    for each in (cred, anthropic):
        ok(nb.delete(f"/api/credentials/{each['id']}"))
