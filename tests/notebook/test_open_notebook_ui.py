"""Open Notebook's web UI against ours: its main journeys made as the UI makes them
(tests/support/open_notebook_ui.py: axios's headers, the raw fetches, the streams),
in the UI's order, with its request bodies, reading exactly the fields its code reads
from each answer, by hard key (a missing field fails the step, as it would throw or
render nothing there). Each step names the UI file (lfnovo/open-notebook,
`frontend/src/`) it follows. Open Notebook's shapes are the specification here.

The model steps run on `llm_nb` (fake providers speaking the real protocols), so a
chat, an ask, a discovery or a model test really calls a provider; its models are set
up through our own API (`setup_models`) so that a journey's failure is its own.

Left out: the podcasts page (episode and speaker profiles are Open Notebook's design,
not our spec), `/embeddings/rebuild` (Advanced page), the credential migrations."""

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from tests.support import documents
from tests.support.notebook import AUTH, LLM_TIMEOUT, PASSWORD, restored
from tests.support.open_notebook_ui import (
    FormValue,
    UiCallFailed,
    UiClient,
    default_models,
    fake_openai_models,
)

STILL_PROCESSING = ("running", "queued", "new")  # lib/hooks/use-sources.ts: refetchInterval while one of these
POLL_DEADLINE = 120.0


@pytest.fixture(scope="module")
def ui_models(llm_nb) -> dict[str, str]:
    return fake_openai_models(llm_nb)


@pytest.fixture
def setup_models(llm_nb, ui_models) -> Iterator[dict[str, str]]:
    """The fake's models as the defaults for the test, the defaults before set back after it."""
    with default_models(llm_nb, ui_models) as chosen:
        yield chosen


@pytest.fixture
def sources_embedded(llm_nb) -> Iterator[None]:
    """The add-source dialog embeds (`default_embedding_option` ask) during the test,
    whatever an earlier module left; the settings before are set back after it."""
    with restored(llm_nb, "/settings"):
        answer = llm_nb.put("/settings", json={"default_embedding_option": "ask"})
        assert answer.status_code == 200, answer.text
        yield


def logged_in(nb) -> UiClient:
    """A tab past the login page (the first journey checks each of these steps)."""
    ui = UiClient(nb.url)
    ui.backend_config()
    assert ui.try_password(PASSWORD).status_code == 200
    ui.token = PASSWORD
    return ui


def unique(name: str) -> str:
    return f"{name} {uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- shared UI steps


def create_notebook(ui: UiClient, name: str, description: str = "") -> dict[str, Any]:
    """components/notebooks/CreateNotebookDialog.tsx -> lib/api/notebooks.ts create."""
    created = ui.post("/notebooks", {"name": name, "description": description})
    read_notebook(created)
    assert created["name"] == name
    return created


def read_notebook(notebook: dict[str, Any]) -> None:
    """What app/(dashboard)/notebooks/components/NotebookCard.tsx shows (types/api.ts NotebookResponse)."""
    assert isinstance(notebook["id"], str) and isinstance(notebook["name"], str)
    assert isinstance(notebook["description"], str) and isinstance(notebook["archived"], bool)
    assert isinstance(notebook["source_count"], int) and isinstance(notebook["note_count"], int)
    assert isinstance(notebook["created"], str) and isinstance(notebook["updated"], str)


def embed_choice(ui: UiClient) -> bool:
    """components/sources/AddSourceDialog.tsx: the dialog loads /settings and
    /transformations, and embeds when `default_embedding_option` is 'always' or 'ask'."""
    settings = ui.get("/settings")
    transformations = ui.get("/transformations")
    assert isinstance(transformations, list)
    for transformation in transformations:
        assert isinstance(transformation["id"], str) and isinstance(transformation["apply_default"], bool)
    return settings["default_embedding_option"] in ("always", "ask")


def add_source(
    ui: UiClient,
    notebooks: list[str],
    kind: str,
    title: str,
    content: str | None = None,
    file: tuple[str, bytes, str] | None = None,
) -> dict[str, Any]:
    """AddSourceDialog.tsx submitSingleSource -> lib/api/sources.ts create: a FormData of
    type, notebooks (JSON), title, content, transformations (JSON), the file, then embed,
    delete_source and async_processing as the strings 'true'/'false'."""
    embed = embed_choice(ui)
    form: list[tuple[str, FormValue]] = [
        ("type", kind),
        ("notebooks", json.dumps(notebooks, separators=(",", ":"))),
        ("title", title),
    ]
    if content is not None:
        form.append(("content", content))
    form.append(("transformations", "[]"))
    if file is not None:
        form.append(("file", file))
    form += [("embed", str(embed).lower()), ("delete_source", "false"), ("async_processing", "true")]
    created = ui.post_form("/sources", form)
    assert isinstance(created["id"], str)
    wait_processed(ui, created["id"])
    return created


def wait_processed(ui: UiClient, source_id: str) -> dict[str, Any]:
    """lib/hooks/use-sources.ts useSourceStatus: GET /sources/{id}/status again while
    `status` is running/queued/new (components/sources/SourceCard.tsx shows `message`)."""
    end = time.monotonic() + POLL_DEADLINE
    while True:
        status = ui.get(f"/sources/{source_id}/status")
        assert isinstance(status["message"], str)
        if status["status"] not in STILL_PROCESSING:
            assert status["status"] == "completed", status
            return status
        assert time.monotonic() < end, f"{source_id} still {status} after {POLL_DEADLINE} s"
        time.sleep(0.2)  # the UI polls on an interval; this waits for a condition with a deadline


def read_source_list_item(item: dict[str, Any]) -> None:
    """components/sources/SourceCard.tsx (types/api.ts SourceListResponse)."""
    assert isinstance(item["id"], str) and (item["title"] is None or isinstance(item["title"], str))
    assert isinstance(item["embedded"], bool) and isinstance(item["embedded_chunks"], int)
    assert isinstance(item["insights_count"], int)
    assert item["asset"] is None or isinstance(item["asset"], dict)
    assert isinstance(item["created"], str) and isinstance(item["updated"], str)


def notebook_sources(ui: UiClient, notebook_id: str) -> list[dict[str, Any]]:
    """lib/hooks/use-sources.ts useNotebookSources: the first page, newest first."""
    page = ui.get(
        "/sources",
        params={"notebook_id": notebook_id, "limit": 30, "offset": 0, "sort_by": "updated", "sort_order": "desc"},
    )
    for item in page:
        read_source_list_item(item)
    return page


def add_text(ui: UiClient, notebook_id: str, title: str, content: str) -> str:
    return add_source(ui, [notebook_id], "text", title, content=content)["id"]


def write_note(ui: UiClient, notebook_id: str, title: str, content: str) -> dict[str, Any]:
    """app/(dashboard)/notebooks/components/NoteEditorDialog.tsx -> lib/api/notes.ts create
    (types/api.ts NoteResponse)."""
    note = ui.post("/notes", {"title": title, "content": content, "note_type": "human", "notebook_id": notebook_id})
    assert isinstance(note["id"], str) and note["title"] == title and note["content"] == content
    assert note["note_type"] == "human" and isinstance(note["created"], str) and isinstance(note["updated"], str)
    return note


# --------------------------------------------------------------------------- journeys


def test_first_load_and_login(llm_nb):
    ui = UiClient(llm_nb.url)
    # components/common/ConnectionGuard.tsx -> lib/config.ts: /api/config, no credentials.
    config = ui.backend_config()
    assert isinstance(config["version"], str) and config["version"]
    assert config.get("dbStatus") in (None, "online")  # "offline" is the database-offline screen
    assert isinstance(config.get("hasUpdate", False), bool)
    # app/(auth)/login/page.tsx -> lib/stores/auth-store.ts checkAuthRequired: no token yet.
    status = ui.get("/auth/status", headers={"Cache-Control": "no-store"})
    assert status["auth_enabled"] is True
    # components/auth/LoginForm.tsx -> auth-store login: a wrong password is a 401 ("Invalid password").
    assert ui.try_password("not-the-password").status_code == 401
    accepted = ui.try_password(PASSWORD)
    assert accepted.status_code == 200 and isinstance(accepted.json(), list)
    ui.token = PASSWORD
    # app/(dashboard)/notebooks/page.tsx -> lib/hooks/use-notebooks.ts: active and archived lists.
    for archived in (False, True):
        for notebook in ui.get("/notebooks", params={"archived": archived, "order_by": "updated desc"}):
            read_notebook(notebook)
            assert notebook["archived"] is archived


def test_dashboard_banners(llm_nb):
    ui = logged_in(llm_nb)
    # components/layout/SetupBanner.tsx -> lib/hooks/use-credentials.ts useCredentialStatus / useEnvStatus.
    status = ui.get("/credentials/status")
    env = ui.get("/credentials/env-status")
    assert isinstance(status["encryption_configured"], bool)
    assert all(isinstance(v, bool) for v in status["configured"].values())
    assert set(status["source"].values()) <= {"database", "environment", "none"}
    assert env and all(isinstance(v, bool) for v in env.values())
    # SetupBanner: for each provider of env-status, `source[provider]` decides the banner.
    for provider in env:
        assert status["source"][provider] in ("database", "environment", "none")
    assert env["openai"] is True  # the stack's OPENAI_API_KEY


def test_create_a_notebook_twice_with_the_same_name(llm_nb):
    ui = logged_in(llm_nb)
    name = unique("Same name")
    first = create_notebook(ui, name, "first")
    second = create_notebook(ui, name, "second")  # Open Notebook allows duplicate names
    assert first["id"] != second["id"]
    # The list refetches (lib/hooks/use-notebooks.ts invalidates 'notebooks').
    listed = [
        n for n in ui.get("/notebooks", params={"archived": False, "order_by": "updated desc"}) if n["name"] == name
    ]
    assert {n["id"] for n in listed} == {first["id"], second["id"]}
    # app/(dashboard)/notebooks/[id]/page.tsx: the notebook, its notes and chat sessions.
    page = ui.get(f"/notebooks/{first['id']}")
    read_notebook(page)
    assert page["source_count"] == 0 and page["note_count"] == 0
    assert ui.get("/notes", params={"notebook_id": first["id"]}) == []
    assert ui.get("/chat/sessions", params={"notebook_id": first["id"]}) == []


def test_upload_a_file_and_poll_it_to_completion(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Uploads"))
    embeds = ui.get("/settings")["default_embedding_option"] in ("always", "ask")
    pdf = documents.pdf_bytes(documents.PDF_TEXT)
    created = add_source(ui, [notebook["id"]], "upload", "Cells", file=("cells.pdf", pdf, "application/pdf"))
    # components/sources/SourceCard.tsx, then app/(dashboard)/sources/[id] -> lib/api/sources.ts get.
    [listed] = notebook_sources(ui, notebook["id"])
    assert listed["id"] == created["id"] and listed["title"] == "Cells"
    detail = ui.get(f"/sources/{created['id']}")
    read_source_list_item(detail)
    assert "powerhouse of the cell" in detail["full_text"]
    assert notebook["id"] in detail["notebooks"]
    assert detail["embedded"] is embeds and (detail["embedded_chunks"] >= 1) is embeds


def test_add_an_existing_source_to_a_second_notebook_and_remove_it(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    first = create_notebook(ui, unique("First"))
    second = create_notebook(ui, unique("Second"))
    source_id = add_text(ui, first["id"], "Tides", "The moon pulls the ocean into tides.")
    # components/notebooks/AddExistingSourceDialog.tsx: the library, then add to this notebook.
    library = ui.get("/sources", params={"limit": 100, "offset": 0, "sort_by": "created", "sort_order": "desc"})
    assert source_id in [item["id"] for item in library]
    ui.post(f"/notebooks/{second['id']}/sources/{source_id}")
    assert [item["id"] for item in notebook_sources(ui, second["id"])] == [source_id]
    assert set(ui.get(f"/sources/{source_id}")["notebooks"]) == {first["id"], second["id"]}
    # components/sources/SourceCard.tsx "remove from notebook" -> notebooksApi.removeSource.
    ui.delete(f"/notebooks/{second['id']}/sources/{source_id}")
    assert notebook_sources(ui, second["id"]) == []
    assert [item["id"] for item in notebook_sources(ui, first["id"])] == [source_id]


def test_write_a_note(llm_nb):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Notes"))
    note = write_note(ui, notebook["id"], "Tide tables", "High water twice a day.")
    # app/(dashboard)/notebooks/components/NotesColumn.tsx -> lib/hooks/use-notes.ts.
    [listed] = ui.get("/notes", params={"notebook_id": notebook["id"]})
    assert listed["id"] == note["id"] and listed["title"] == "Tide tables"
    # NoteEditorDialog.tsx editing: title and content.
    edited = ui.put(f"/notes/{note['id']}", {"title": "Tide tables", "content": "Twice a day."})
    assert edited["content"] == "Twice a day."
    assert ui.get(f"/notebooks/{notebook['id']}")["note_count"] == 1


def test_chat_with_one_source_left_out_of_the_context(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Chat"))
    kept = add_text(ui, notebook["id"], "Glaciers", "Glaciers carve U-shaped valleys.")
    left_out = add_text(ui, notebook["id"], "Secret", "The password of the vault is saffron.")
    note = write_note(ui, notebook["id"], "Valleys", "Rivers cut V-shaped valleys.")
    # app/(dashboard)/notebooks/components/ChatColumn.tsx -> lib/hooks/use-notebook-chat.ts.
    assert ui.get("/chat/sessions", params={"notebook_id": notebook["id"]}) == []
    context_config = {
        "sources": {kept: "full content", left_out: "not in"},
        "notes": {note["id"]: "full content"},
    }
    # useNotebookChat's effect: the context's counts on every change of the selections.
    built = ui.post("/chat/context", {"notebook_id": notebook["id"], "context_config": context_config})
    assert isinstance(built["token_count"], int) and isinstance(built["char_count"], int)
    assert isinstance(built["context"]["sources"], list) and isinstance(built["context"]["notes"], list)
    assert "saffron" not in str(built["context"]) and "U-shaped" in str(built["context"])
    assert "V-shaped" in str(built["context"]["notes"])
    # sendMessage: no session yet -> create one titled by the message, then context, then execute.
    message = "What shapes do valleys take?"
    session = ui.post("/chat/sessions", {"notebook_id": notebook["id"], "title": message})
    assert isinstance(session["id"], str) and session["title"] == message
    assert session["notebook_id"] == notebook["id"]
    context = ui.post("/chat/context", {"notebook_id": notebook["id"], "context_config": context_config})["context"]
    llm_nb.fake.reset()
    answer = ui.post("/chat/execute", {"session_id": session["id"], "message": message, "context": context})
    assert answer["session_id"] == session["id"]
    human, ai = answer["messages"][-2:]
    assert human["type"] == "human" and human["content"] == message and isinstance(human["id"], str)
    assert ai["type"] == "ai" and ai["content"] and isinstance(ai["id"], str)
    sent = str([seen["body"] for seen in llm_nb.fake.seen])
    assert "U-shaped" in sent and "saffron" not in sent
    # refetchCurrentSession.
    again = ui.get(f"/chat/sessions/{session['id']}")
    assert [m["type"] for m in again["messages"]] == ["human", "ai"]
    assert [s["id"] for s in ui.get("/chat/sessions", params={"notebook_id": notebook["id"]})] == [session["id"]]


def search_body(query: str, kind: str) -> dict[str, Any]:
    """app/(dashboard)/search/page.tsx handleSearch: both kinds of content, 100 results, 0.2."""
    return {
        "query": query,
        "type": kind,
        "limit": 100,
        "search_sources": True,
        "search_notes": True,
        "minimum_score": 0.2,
    }


def test_search_both_ways(llm_nb, setup_models, sources_embedded):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Search"))
    volcano = add_text(ui, notebook["id"], "Volcanoes", "Volcanoes erupt molten lava and ash.")
    # search/page.tsx: the defaults decide whether vector search is offered.
    defaults = ui.get("/models/defaults")
    assert defaults["default_embedding_model"] == setup_models["embedding"]
    for kind, query in (("text", "molten lava"), ("vector", "lava and ash")):
        # lib/hooks/use-search.ts: final_score from relevance/similarity/score; results sorted.
        found = ui.post("/search", search_body(query, kind))
        assert found["search_type"] == kind and found["total_count"] == len(found["results"])
        hits = [r for r in found["results"] if r["parent_id"] == volcano]
        assert hits, found
        for result in found["results"]:
            assert isinstance(result["id"], str) and isinstance(result["title"], str)
            assert result["parent_id"].split(":")[0] in ("source", "note", "source_insight")
            score = result.get("relevance", result.get("similarity", result.get("score")))
            assert isinstance(score, (int, float)), result


def test_vector_and_text_searches_at_once_beside_page_loads(llm_nb, setup_models, sources_embedded):
    """The UI's pages load while searches run. A vector search's CPU work runs in the
    threadpool, whose real threads must never take a pooled database connection: on
    SQLite one moved between threads answered 500 (sqlite3's per-thread check); on
    PostgreSQL a thread waiting on the pool's (gevent) lock deadlocked the burst."""
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Burst"))
    add_text(ui, notebook["id"], "Geysers", "Geysers spout boiling water and steam.")
    calls = [("POST", "/api/search", search_body("boiling water", "vector"))] * 16
    calls += [("POST", "/api/search", search_body("boiling water", "text"))] * 8
    calls += [("GET", "/api/notebooks", None)] * 40
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(
            pool.map(
                lambda call: requests.request(
                    call[0], llm_nb.url + call[1], json=call[2], headers=AUTH, timeout=LLM_TIMEOUT * 20
                ),
                calls,
            )
        )
    failed = [(call[1], answer.status_code, answer.text[:200]) for call, answer in zip(calls, answers, strict=True)]
    assert [f for f in failed if f[1] != 200] == []
    assert ui.get("/config")["dbStatus"] == "online"


def test_ask_and_read_the_stream(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Ask"))
    add_text(ui, notebook["id"], "Coral", "Coral reefs bleach when the sea warms.")
    # app/(dashboard)/search/page.tsx handleAsk: the three models are the default chat model.
    chat_model = ui.get("/models/defaults")["default_chat_model"]
    assert chat_model == setup_models["chat"]
    question = "Why do coral reefs bleach?"
    events = ui.stream(
        "/search/ask",
        {
            "question": question,
            "strategy_model": chat_model,
            "answer_model": chat_model,
            "final_answer_model": chat_model,
        },
    )
    # lib/hooks/use-ask.ts: strategy (reasoning, searches), answers, final_answer, complete.
    types = [event["type"] for event in events]
    assert "error" not in types, events
    strategy = next(e for e in events if e["type"] == "strategy")
    assert isinstance(strategy["reasoning"], str)
    assert all(isinstance(s["term"], str) and isinstance(s["instructions"], str) for s in strategy["searches"])
    assert all(isinstance(e["content"], str) for e in events if e["type"] == "answer")
    final = next(e for e in events if e["type"] == "final_answer")["content"]
    assert final and types[-1] == "complete" and events[-1]["final_answer"] == final


def test_source_chat(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Source chat"))
    source_id = add_text(ui, notebook["id"], "Tea", "Green tea is steamed; black tea is oxidised.")
    # app/(dashboard)/sources/[id]/page.tsx -> components/sources/ChatPanel.tsx -> lib/hooks/use-source-chat.ts.
    assert ui.get(f"/sources/{source_id}/chat/sessions") == []
    message = "How is black tea made?"
    # sendMessage without a session: create one titled by the message, with source_id in the body.
    session = ui.post(
        f"/sources/{source_id}/chat/sessions", {"title": message, "source_id": source_id.removeprefix("source:")}
    )
    assert isinstance(session["id"], str) and session["title"] == message
    assert session["source_id"].removeprefix("source:") == source_id.removeprefix("source:")
    listed = ui.get(f"/sources/{source_id}/chat/sessions")
    assert [s["id"] for s in listed] == [session["id"]]
    events = ui.stream(f"/sources/{source_id}/chat/sessions/{session['id']}/messages", {"message": message})
    types = [event["type"] for event in events]
    assert "error" not in types, events
    assert types[0] == "user_message" and types[-1] == "complete"
    reply = "".join(e["content"] for e in events if e["type"] == "ai_message")
    assert reply
    [indicators] = [e["data"] for e in events if e["type"] == "context_indicators"]
    assert {"sources", "insights", "notes"} <= set(indicators) and source_id in indicators["sources"]
    # refetchCurrentSession: the stored conversation.
    stored = ui.get(f"/sources/{source_id}/chat/sessions/{session['id']}")
    assert [(m["type"], m["content"]) for m in stored["messages"]] == [("human", message), ("ai", reply)]
    ui.delete(f"/sources/{source_id}/chat/sessions/{session['id']}")
    assert ui.get(f"/sources/{source_id}/chat/sessions") == []


def test_configure_a_credential(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    # app/(dashboard)/settings/api-keys/page.tsx: providers, credentials, models.
    providers = ui.get("/providers")
    openai = next(p for p in providers if p["name"] == "openai")
    assert isinstance(openai["display_name"], str) and openai["modalities"]
    assert isinstance(openai["env_configured"], bool)
    # components/settings/CredentialFormDialog.tsx: the provider's modalities, key, base URL.
    name = unique("UI key")
    created = ui.post(
        "/credentials",
        {
            "name": name,
            "provider": "openai",
            "modalities": openai["modalities"],
            "api_key": "sk-good",
            "base_url": llm_nb.fake.base_url("openai"),
        },
    )
    cred_id = created["id"]
    assert created["name"] == name and created["provider"] == "openai" and created["has_api_key"] is True
    assert created["modalities"] == openai["modalities"] and created["model_count"] == 0
    listed = next(c for c in ui.get("/credentials") if c["id"] == cred_id)
    assert listed["modalities"][0] in ("language", "embedding", "text_to_speech", "speech_to_text")
    # components/settings/CredentialItem.tsx: test the connection.
    tested = ui.post(f"/credentials/{cred_id}/test")
    assert tested["success"] is True and tested["provider"] == "openai" and isinstance(tested["message"], str)
    # components/settings/DiscoverModelsDialog.tsx: discover, then register the picked ones, one type at a time.
    discovered = ui.post(f"/credentials/{cred_id}/discover")
    assert discovered["credential_id"] == cred_id and discovered["provider"] == "openai"
    names = {m["name"]: m["provider"] for m in discovered["discovered"]}
    assert {"fake-chat", "fake-embed"} <= set(names)
    for picked, model_type in (("fake-chat", "language"), ("fake-embed", "embedding")):
        body = {"models": [{"name": picked, "provider": names[picked], "model_type": model_type}]}
        registered = ui.post(f"/credentials/{cred_id}/register-models", body)
        assert (registered["created"], registered["existing"]) == (1, 0)
    # CredentialItem.tsx: the models linked to this credential, by type.
    linked = {m["type"]: m for m in ui.get("/models") if m["credential"] == cred_id}
    assert {linked["language"]["name"], linked["embedding"]["name"]} == {"fake-chat", "fake-embed"}
    assert ui.get(f"/credentials/{cred_id}")["model_count"] == 2
    # components/settings/DefaultModelSelectors.tsx: one slot at a time (Partial<ModelDefaults>).
    chat = linked["language"]["id"]
    defaults = ui.put("/models/defaults", {"default_chat_model": chat})
    assert defaults["default_chat_model"] == chat
    assert defaults["default_embedding_model"] == setup_models["embedding"]  # untouched
    # CredentialItem.tsx: test one model (components/settings/ModelTestResultDialog.tsx).
    result = ui.post(f"/models/{chat}/test")
    assert result["success"] is True and isinstance(result["message"], str)
    # components/settings/DeleteCredentialDialog.tsx: delete with its models.
    deleted = ui.delete(f"/credentials/{cred_id}", params={"delete_models": True})
    assert deleted["deleted_models"] == 2 and isinstance(deleted["message"], str)
    assert cred_id not in [c["id"] for c in ui.get("/credentials")]
    assert not [m for m in ui.get("/models") if m["credential"] == cred_id]


SETTINGS_FORM = (
    "default_content_processing_engine_doc",
    "default_content_processing_engine_url",
    "default_embedding_option",
    "auto_delete_files",
    "docling_ocr",
    "docling_formulas",
    "docling_vision",
)


def test_settings(llm_nb):
    ui = logged_in(llm_nb)
    # app/(dashboard)/settings/components/SettingsForm.tsx: settings and capabilities.
    settings = ui.get("/settings")
    capabilities = ui.get("/capabilities")
    for key in ("docling_available", "crawl4ai_available", "crawl4ai_remote_configured"):
        assert isinstance(capabilities[key], bool)
    before = settings["default_embedding_option"]
    assert before in ("ask", "always", "never")
    # The form submits its fields, as loaded, with the changed one (undefined ones are left out).
    form = {key: settings[key] for key in SETTINGS_FORM if settings.get(key) is not None}
    try:
        saved = ui.put("/settings", {**form, "default_embedding_option": "never"})
        assert saved["default_embedding_option"] == "never"
        assert ui.get("/settings")["default_embedding_option"] == "never"
    finally:
        ui.put("/settings", {"default_embedding_option": before})
    assert ui.get("/settings")["default_embedding_option"] == before


def test_transformations_default_prompt(llm_nb):
    ui = logged_in(llm_nb)
    # app/(dashboard)/transformations -> components/transformations/DefaultPromptEditor.tsx.
    before = ui.get("/transformations/default-prompt")["transformation_instructions"]
    assert isinstance(before, str)
    try:
        saved = ui.put("/transformations/default-prompt", {"transformation_instructions": "Write in plain English."})
        assert saved["transformation_instructions"] == "Write in plain English."
        assert ui.get("/transformations/default-prompt")["transformation_instructions"] == "Write in plain English."
    finally:
        ui.put("/transformations/default-prompt", {"transformation_instructions": before})


def test_recently_viewed(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    notebook = create_notebook(ui, unique("Viewed"))
    source_id = add_text(ui, notebook["id"], "Moss", "Moss grows on the north side.")
    # Opening the notebook's page, then the source's page, stamps each as viewed.
    ui.get(f"/notebooks/{notebook['id']}")
    ui.get(f"/sources/{source_id}")
    # app/(dashboard)/notebooks/components/RecentlyViewed.tsx: newest first, 12 at most.
    recent = ui.get("/recently-viewed", params={"limit": 12})
    assert len(recent) <= 12
    for item in recent:
        assert item["type"] in ("notebook", "source") and isinstance(item["title"], str)
        assert isinstance(item["id"], str) and isinstance(item["last_viewed_at"], str)
    assert [(i["type"], i["id"]) for i in recent[:2]] == [("source", source_id), ("notebook", notebook["id"])]
    assert recent[1]["title"] == notebook["name"] and recent[0]["title"] == "Moss"


def test_delete_preview_then_delete_a_notebook(llm_nb, setup_models):
    ui = logged_in(llm_nb)
    doomed = create_notebook(ui, unique("Doomed"))
    other = create_notebook(ui, unique("Other"))
    exclusive = add_text(ui, doomed["id"], "Only here", "A source of this notebook alone.")
    shared = add_source(ui, [doomed["id"], other["id"]], "text", "Shared", content="A source of both notebooks.")["id"]
    write_note(ui, doomed["id"], "Note", "A note of the doomed notebook.")
    # app/(dashboard)/notebooks/components/NotebookDeleteDialog.tsx: the preview, then
    # delete with its exclusive sources.
    preview = ui.get(f"/notebooks/{doomed['id']}/delete-preview")
    assert preview["notebook_id"] == doomed["id"] and preview["notebook_name"] == doomed["name"]
    assert (preview["note_count"], preview["exclusive_source_count"], preview["shared_source_count"]) == (1, 1, 1)
    deleted = ui.delete(f"/notebooks/{doomed['id']}", params={"delete_exclusive_sources": True})
    assert isinstance(deleted["message"], str)
    assert (deleted["deleted_notes"], deleted["deleted_sources"], deleted["unlinked_sources"]) == (1, 1, 1)
    with pytest.raises(UiCallFailed) as gone:
        ui.get(f"/sources/{exclusive}")
    assert gone.value.status == 404
    assert ui.get(f"/sources/{shared}")["notebooks"] == [other["id"]]
    assert doomed["id"] not in [n["id"] for n in ui.get("/notebooks", params={"archived": False})]
