"""Provider credentials, models and defaults against the running service, with the
fake providers (devtools.fake_providers) standing in for OpenAI, Ollama and
Anthropic: what our code sends, and what it makes of the answers."""

import time

import pytest

from tests.support.notebook import PROVIDER_HOST, credential, model


def test_without_a_language_model_every_feature_says_which_is_missing(llm_nb):
    nb = llm_nb
    # The stack is shared: whatever ran before, no default model is set now.
    cleared = nb.put("/models/defaults", json={key: None for key in nb.get("/models/defaults").json()})
    assert cleared.status_code == 200 and set(cleared.json().values()) == {None}
    nb.fake.reset()
    notebook = nb.notebook()
    session = nb.post("/chat/sessions", json={"notebook_id": notebook}).json()
    answers = [
        nb.post("/chat/execute", json={"session_id": session["id"], "message": "hi"}),
        nb.post("/ask", json={"question": "what is ice?"}),
        nb.post("/podcasts/generate", json={"notebook_id": notebook, "episode_name": "e1"}),
    ]
    for response in answers:
        assert response.status_code == 400, response.text
        assert "default_chat_model" in response.json()["detail"]
    assert nb.get(f"/chat/sessions/{session['id']}").json()["messages"] == []
    assert nb.get("/podcasts/episodes").json() == []
    assert not nb.fake.seen


def test_a_key_is_stored_encrypted_and_never_answered(llm_nb):
    nb = llm_nb
    secret = "sk-good"
    created = credential(nb, "openai", key=secret)
    assert created["has_api_key"] is True and created["decryption_error"] is None
    assert secret not in str(nb.get("/credentials").json()) and "api_key" not in created
    [(token,)] = nb.query("SELECT api_key_encrypted FROM credential WHERE id = ?", (created["id"].split(":")[1],))
    assert token and secret not in token
    updated = nb.put(f"/credentials/{created['id']}", json={"name": "renamed", "api_key": None})
    assert updated.status_code == 200 and updated.json()["has_api_key"] is False
    assert nb.delete(f"/credentials/{created['id']}").status_code == 200
    assert nb.get(f"/credentials/{created['id']}").status_code == 404


@pytest.mark.parametrize("base_url", ["http://127.0.0.1:9/v1", "http://169.254.169.254/latest", "ftp://x/"])
def test_base_urls_pass_the_ssrf_guard(llm_nb, base_url):
    response = llm_nb.post("/credentials", json={"name": "x", "provider": "openai_compatible", "base_url": base_url})
    assert response.status_code == 400 and response.json()["field"] == "base_url", response.text
    assert base_url not in str(llm_nb.get("/credentials").json())


def test_credential_test_makes_a_real_call(llm_nb):
    nb = llm_nb
    nb.fake.reset()
    good = credential(nb, "openai", key="sk-good")
    tested = nb.post(f"/credentials/{good['id']}/test").json()
    assert tested == {"provider": "openai", "success": True, "message": "connected: the provider lists 3 model(s)"}
    assert nb.fake.seen[-1]["authorization"] == "Bearer sk-good"
    bad = credential(nb, "openai", key="sk-wrong-key-123456")
    tested = nb.post(f"/credentials/{bad['id']}/test").json()
    assert tested["success"] is False and "rejected the API key" in tested["message"]
    assert "sk-wrong" not in tested["message"]  # the provider echoes part of the key: never passed on
    closed = credential(nb, "openai_compatible", base_url=f"http://{PROVIDER_HOST}:9/v1")
    tested = nb.post(f"/credentials/{closed['id']}/test").json()
    assert tested["success"] is False and "could not be reached" in tested["message"]
    for cred in (good, bad, closed):
        nb.delete(f"/credentials/{cred['id']}")


def test_discover_and_register_per_provider(llm_nb):
    nb = llm_nb
    nb.fake.reset()
    expected = {
        "openai": ["fake-chat", "fake-embed", "fake-tts"],
        "ollama": ["llama-fake:latest", "nomic-fake:latest"],
        "anthropic": ["claude-fake-1", "claude-fake-2"],
    }
    keys = {"openai": "sk-good", "anthropic": "ant-good", "ollama": None}
    for provider, names in expected.items():
        cred = credential(nb, provider, key=keys[provider])
        found = nb.post(f"/credentials/{cred['id']}/discover")
        assert found.status_code == 200, found.text
        assert [m["name"] for m in found.json()["discovered"]] == names
        first = nb.post(f"/credentials/{cred['id']}/register-models", json={"models": [{"name": n} for n in names]})
        again = nb.post(f"/credentials/{cred['id']}/register-models", json={"models": [{"name": names[0]}]})
        assert (first.json()["created"], first.json()["existing"]) == (len(names), 0)
        assert (again.json()["created"], again.json()["existing"]) == (0, 1)
        assert all(m["registered"] for m in nb.post(f"/credentials/{cred['id']}/discover").json()["discovered"])
    anthropic = [r for r in nb.fake.seen if r["provider"] == "anthropic"]
    assert anthropic and all(r["x_api_key"] == "ant-good" and r["anthropic_version"] == "2023-06-01" for r in anthropic)
    assert all(r["path"] == "/ollama/api/tags" for r in nb.fake.seen if r["provider"] == "ollama")


def test_models_and_defaults(llm_nb):
    nb = llm_nb
    cred = credential(nb, "openai", key="sk-good")
    chat = model(nb, f"chat-{time.monotonic_ns()}", "openai", cred)
    embed = model(nb, f"embed-{time.monotonic_ns()}", "openai", cred, kind="embedding")
    duplicate = nb.post(
        "/models", json={"name": chat["name"], "provider": "openai", "type": "language", "credential": cred["id"]}
    )
    assert duplicate.status_code == 409
    assert chat["id"] in [m["id"] for m in nb.get("/models?type=language").json()]
    assert embed["id"] not in [m["id"] for m in nb.get("/models?type=language").json()]
    wrong_type = nb.post("/models/config", json={"default_chat_model": embed["id"]})
    assert wrong_type.status_code == 400 and wrong_type.json()["field"] == "default_chat_model"
    unknown = nb.put("/models/defaults", json={"default_chat_model": "model:nosuchmodel"})
    assert unknown.status_code == 404
    assert nb.post("/models", json={"name": "x", "provider": "anthropic", "type": "embedding"}).status_code == 400
    done = nb.put("/models/defaults", json={"default_embedding_model": embed["id"]})
    assert done.status_code == 200 and done.json()["default_embedding_model"] == embed["id"]
    assert nb.delete(f"/models/{embed['id']}").status_code == 200
    assert nb.get("/models/defaults").json()["default_embedding_model"] is None


def test_status_env_status_and_migration(llm_nb):
    nb = llm_nb
    env = nb.get("/credentials/env-status").json()
    assert env == {"openai": True, "openai_compatible": False, "ollama": False, "anthropic": False}
    assert "sk-good" not in str(env)
    migrated = nb.post("/credentials/migrate-from-env").json()
    assert migrated["errors"] == []
    assert "openai" in migrated["migrated"] + migrated["skipped"]
    again = nb.post("/credentials/migrate-from-env").json()
    assert again["migrated"] == [] and "openai" in again["skipped"]
    status = nb.get("/credentials/status").json()
    assert status["encryption_configured"] is True
    assert status["configured"]["openai"] is True and status["source"]["openai"] == "database"
    assert status["providers"]["openai"] == {
        "configured": True,
        "source": "database",
        "credentials": status["providers"]["openai"]["credentials"],
    }


def test_without_an_encryption_key_a_key_cannot_be_stored(nb):
    response = nb.post("/credentials", json={"name": "k", "provider": "openai", "api_key": "sk-x"})
    assert response.status_code == 400 and "NOTEBOOK_ENCRYPTION_KEY" in response.json()["detail"]
    assert nb.get("/credentials").json() == []
    keyless = nb.post("/credentials", json={"name": "local", "provider": "anthropic"})
    assert keyless.status_code == 201 and keyless.json()["has_api_key"] is False
    nb.delete(f"/credentials/{keyless.json()['id']}")


def test_a_malformed_encryption_key_stops_the_start(monkeypatch, tmp_path):
    from app.common.config import ConfigError
    from app.notebook.settings import NotebookSettings

    monkeypatch.setenv("NOTEBOOK_ENCRYPTION_KEY", "not-a-fernet-key")
    monkeypatch.setenv("NOTEBOOK_ALLOW_NO_PASSWORD", "1")
    with pytest.raises(ConfigError, match="NOTEBOOK_ENCRYPTION_KEY"):
        NotebookSettings.from_env(str(tmp_path))
