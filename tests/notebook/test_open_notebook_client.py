"""Clients written for Open Notebook work against ours: the API driven through a small
client of our own shaped like theirs (its `api/client.py` and the service wrappers
that called it): the same paths and bodies, JSON on every success (it calls
`response.json()` on every answer, DELETE included), and the fields their code reads
with hard key access. Where our spec differs on purpose, their form is an alias
(/api/sources/json, /api/search/ask, /api/commands/jobs/{id}).

Settings, /embed, the embedding rebuild and its status, and a notebook's /context are
served in their shapes (the context is /chat/context/build's, in their fields); command
status carries their `job_id`. Left out, as not in our spec: episode and speaker profiles."""

import time

import pytest
import requests

from app.common.sse_client import iter_records
from tests.support.notebook import AUTH, credential, restored

JOB_DEADLINE = 60.0
DEFAULT_SLOTS = (
    "default_chat_model",
    "default_transformation_model",
    "large_context_model",
    "default_text_to_speech_model",
    "default_speech_to_text_model",
    "default_embedding_model",
    "default_tools_model",
)


class OpenNotebookStyleClient:
    """Their APIClient's calls: `/api` paths, JSON bodies only, raise on any non-2xx,
    and `response.json()` of every success."""

    def __init__(self, base_url):
        self.base_url = base_url + "/api"

    def _make_request(self, method, path, **kwargs):
        response = requests.request(method, self.base_url + path, headers=AUTH, timeout=60, **kwargs)
        if not response.ok:
            raise RuntimeError(f"API request failed: {response.status_code} - {response.text}")
        return response.json()

    # notebooks
    def get_notebooks(self, archived=None, order_by="updated desc"):
        params = {"order_by": order_by}
        if archived is not None:
            params["archived"] = str(archived).lower()
        return self._make_request("GET", "/notebooks", params=params)

    def create_notebook(self, name, description=""):
        return self._make_request("POST", "/notebooks", json={"name": name, "description": description})

    def update_notebook(self, notebook_id, **updates):
        return self._make_request("PUT", f"/notebooks/{notebook_id}", json=updates)

    def delete_notebook(self, notebook_id):
        return self._make_request("DELETE", f"/notebooks/{notebook_id}")

    # sources
    def create_source(
        self,
        notebook_id=None,
        notebooks=None,
        source_type="text",
        url=None,
        content=None,
        title=None,
        transformations=None,
        embed=False,
        delete_source=False,
        async_processing=False,
    ):
        data = {
            "type": source_type,
            "embed": embed,
            "delete_source": delete_source,
            "async_processing": async_processing,
        }
        if notebooks:
            data["notebooks"] = notebooks
        elif notebook_id:
            data["notebook_id"] = notebook_id
        for name, value in (("url", url), ("content", content), ("title", title), ("transformations", transformations)):
            if value:
                data[name] = value
        return self._make_request("POST", "/sources/json", json=data)

    def get_sources(self, notebook_id=None, **params):
        if notebook_id:
            params["notebook_id"] = notebook_id
        return self._make_request("GET", "/sources", params=params)

    def get_source(self, source_id):
        return self._make_request("GET", f"/sources/{source_id}")

    def get_source_status(self, source_id):
        return self._make_request("GET", f"/sources/{source_id}/status")

    def update_source(self, source_id, **updates):
        return self._make_request("PUT", f"/sources/{source_id}", json=updates)

    def delete_source(self, source_id):
        return self._make_request("DELETE", f"/sources/{source_id}")

    # notes
    def create_note(self, content, title=None, note_type="human", notebook_id=None):
        data = {"content": content, "note_type": note_type}
        if title:
            data["title"] = title
        if notebook_id:
            data["notebook_id"] = notebook_id
        return self._make_request("POST", "/notes", json=data)

    def get_notes(self, notebook_id=None):
        return self._make_request("GET", "/notes", params={"notebook_id": notebook_id} if notebook_id else {})

    def update_note(self, note_id, **updates):
        return self._make_request("PUT", f"/notes/{note_id}", json=updates)

    def delete_note(self, note_id):
        return self._make_request("DELETE", f"/notes/{note_id}")

    # models
    def get_models(self, model_type=None):
        return self._make_request("GET", "/models", params={"type": model_type} if model_type else {})

    def create_model(self, name, provider, model_type):
        return self._make_request("POST", "/models", json={"name": name, "provider": provider, "type": model_type})

    def delete_model(self, model_id):
        return self._make_request("DELETE", f"/models/{model_id}")

    def get_default_models(self):
        return self._make_request("GET", "/models/defaults")

    def update_default_models(self, **defaults):
        return self._make_request("PUT", "/models/defaults", json=defaults)

    # transformations and insights
    def get_transformations(self):
        return self._make_request("GET", "/transformations")

    def create_transformation(self, name, title, description, prompt, apply_default=False):
        return self._make_request(
            "POST",
            "/transformations",
            json={
                "name": name,
                "title": title,
                "description": description,
                "prompt": prompt,
                "apply_default": apply_default,
            },
        )

    def get_transformation(self, transformation_id):
        return self._make_request("GET", f"/transformations/{transformation_id}")

    def update_transformation(self, transformation_id, **updates):
        return self._make_request("PUT", f"/transformations/{transformation_id}", json=updates)

    def delete_transformation(self, transformation_id):
        return self._make_request("DELETE", f"/transformations/{transformation_id}")

    def execute_transformation(self, transformation_id, input_text, model_id=None):
        return self._make_request(
            "POST",
            "/transformations/execute",
            json={"transformation_id": transformation_id, "input_text": input_text, "model_id": model_id},
        )

    def create_source_insight(self, source_id, transformation_id, model_id=None):
        data = {"transformation_id": transformation_id}
        if model_id:
            data["model_id"] = model_id
        return self._make_request("POST", f"/sources/{source_id}/insights", json=data)

    def get_source_insights(self, source_id):
        return self._make_request("GET", f"/sources/{source_id}/insights")

    def get_insight(self, insight_id):
        return self._make_request("GET", f"/insights/{insight_id}")

    def delete_insight(self, insight_id):
        return self._make_request("DELETE", f"/insights/{insight_id}")

    # search, ask, commands
    def search(self, query, search_type="text", limit=100, search_sources=True, search_notes=True, minimum_score=0.2):
        return self._make_request(
            "POST",
            "/search",
            json={
                "query": query,
                "type": search_type,
                "limit": limit,
                "search_sources": search_sources,
                "search_notes": search_notes,
                "minimum_score": minimum_score,
            },
        )

    def ask_simple(self, question, strategy_model, answer_model, final_answer_model):
        return self._make_request(
            "POST",
            "/search/ask/simple",
            json={
                "question": question,
                "strategy_model": strategy_model,
                "answer_model": answer_model,
                "final_answer_model": final_answer_model,
            },
        )

    def ask_stream(self, **body):
        with requests.post(self.base_url + "/search/ask", json=body, headers=AUTH, stream=True, timeout=60) as response:
            response.raise_for_status()
            return [record.json() for record in iter_records(response)]

    def get_command(self, command_id):
        return self._make_request("GET", f"/commands/jobs/{command_id}")

    # embedding, settings, context
    def embed_content(self, item_id, item_type, async_processing=False):
        return self._make_request(
            "POST", "/embed", json={"item_id": item_id, "item_type": item_type, "async_processing": async_processing}
        )

    def rebuild_embeddings(self, mode="existing", include_sources=True, include_notes=True, include_insights=True):
        return self._make_request(
            "POST",
            "/embeddings/rebuild",
            json={
                "mode": mode,
                "include_sources": include_sources,
                "include_notes": include_notes,
                "include_insights": include_insights,
            },
        )

    def get_rebuild_status(self, command_id):
        return self._make_request("GET", f"/embeddings/rebuild/{command_id}/status")

    def get_settings(self):
        return self._make_request("GET", "/settings")

    def update_settings(self, **settings):
        return self._make_request("PUT", "/settings", json=settings)

    def get_notebook_context(self, notebook_id, context_config=None):
        data = {"notebook_id": notebook_id}
        if context_config:
            data["context_config"] = context_config
        return self._make_request("POST", f"/notebooks/{notebook_id}/context", json=data)


# -- what their service wrappers read -------------------------------------------------


def hard_reads(record, *fields):
    """`record[field]` for each, as their wrappers read them (a missing one is a KeyError)."""
    return [record[field] for field in fields]


def source_object(data):
    """Their Source model: hard reads of title, topics, asset (its file_path and url when
    there is one), id, created, updated; full_text and embedded_chunks tolerant."""
    asset = data["asset"]
    return {
        "id": data["id"],
        "title": data["title"],
        "topics": data["topics"],
        "asset": {"file_path": asset["file_path"], "url": asset["url"]} if asset else None,
        "full_text": data.get("full_text"),
        "embedded_chunks": data.get("embedded_chunks", 0),
        "created": data["created"],
        "updated": data["updated"],
    }


def created_source(data):
    """Their create wrapper: a command_id, a status or processing_info means a job."""
    if data.get("command_id") or data.get("status") or data.get("processing_info"):
        return "async", data["command_id"], data["status"], source_object(data)
    return "sync", None, None, source_object(data)


def wait_processed(client, source_id):
    """Their polling: until the status is completed, failed or None."""
    deadline = time.monotonic() + JOB_DEADLINE
    while True:
        status = client.get_source_status(source_id)["status"]
        if status in ("completed", "failed", None):
            return status
        assert time.monotonic() < deadline, f"{source_id} still {status}"
        time.sleep(0.1)  # polling with a deadline, as their client does


@pytest.fixture(scope="module")
def client(llm_nb):
    return OpenNotebookStyleClient(llm_nb.url)


@pytest.fixture(scope="module")
def chat_model(llm_nb, client):
    """A language model under an openai credential (the fake provider), the default chat
    model for this module (the defaults before set back at its end: the stack is shared)."""
    cred = credential(llm_nb, "openai", key="sk-good")
    made = llm_nb.post(
        "/models", json={"name": "fake-chat", "provider": "openai", "type": "language", "credential": cred["id"]}
    ).json()
    with restored(llm_nb, "/models/defaults") as (defaults,):
        client.update_default_models(
            **{**{slot: defaults.get(slot) for slot in DEFAULT_SLOTS}, "default_chat_model": made["id"]}
        )
        yield made


def test_notebooks_as_their_client_lists_sorts_and_deletes_them(client):
    stamp = time.monotonic_ns()
    first = client.create_notebook(f"b-notebook {stamp}", "second by name")
    second = client.create_notebook(f"a-notebook {stamp}")
    for notebook in (first, second):
        hard_reads(notebook, "name", "description", "archived", "id", "created", "updated")
    names = [n["name"] for n in client.get_notebooks(order_by="name") if str(stamp) in n["name"]]
    assert names == [f"a-notebook {stamp}", f"b-notebook {stamp}"]  # a field alone sorts ascending
    names = [n["name"] for n in client.get_notebooks(order_by="name desc") if str(stamp) in n["name"]]
    assert names == [f"b-notebook {stamp}", f"a-notebook {stamp}"]
    updated = client.update_notebook(first["id"], name=first["name"], description="changed", archived=True)
    assert (updated["description"], updated["archived"]) == ("changed", True)
    assert first["id"] in [n["id"] for n in client.get_notebooks(archived=True)]

    only_here = client.create_source(notebook_id=first["id"], content="Only in the first notebook.")
    shared = client.create_source(notebooks=[first["id"], second["id"]], content="In both notebooks.")
    deleted = client.delete_notebook(first["id"])  # their client never asks to delete sources
    assert (deleted["deleted_notes"], deleted["deleted_sources"], deleted["unlinked_sources"]) == (0, 0, 1)
    assert "kept" in deleted["message"]
    assert client.get_source(only_here["id"])["notebooks"] == []  # kept: no data lost
    assert client.get_source(shared["id"])["notebooks"] == [second["id"]]


def test_sources_as_their_client_creates_reads_updates_and_sorts_them(client, chat_model):
    notebook = client.create_notebook(f"sources {time.monotonic_ns()}")["id"]
    kind, command_id, status, source = created_source(
        client.create_source(
            notebook_id=notebook, title="Fjords", content="Fjords are valleys that glaciers carved and the sea filled."
        )
    )
    assert (kind, command_id, status) == ("sync", None, None)  # done: nothing to poll
    assert source["asset"] is None and "glaciers carved" in source["full_text"]

    kind, command_id, status, queued = created_source(
        client.create_source(
            notebook_id=notebook,
            title="Moraines",
            content="Moraines are ridges of rock that glaciers leave.",
            async_processing=True,
        )
    )
    assert kind == "async" and status == "new" and command_id.startswith("command:")
    assert queued["title"] == "Moraines" and queued["asset"] is None
    assert wait_processed(client, queued["id"]) == "completed"
    assert client.get_command(command_id)["status"] == "completed"  # their /commands/jobs/{id}
    read = source_object(client.get_source(queued["id"]))
    assert "ridges of rock" in read["full_text"]

    changed = client.update_source(queued["id"], title="Moraine ridges", topics=["glaciology"])
    assert (changed["title"], changed["topics"]) == ("Moraine ridges", ["glaciology"])
    assert "full_text" in changed and "ridges of rock" in changed["full_text"]

    listed = [source_object(s) for s in client.get_sources(notebook)]
    assert {s["title"] for s in listed} == {"Fjords", "Moraine ridges"}
    transformation = client.create_transformation(
        f"keywords {time.monotonic_ns()}", "Keywords", "", "List the keywords."
    )
    started = client.create_source_insight(read["id"], transformation["id"])
    assert started["status"] == "pending" and started["command_id"].startswith("command:")
    deadline = time.monotonic() + JOB_DEADLINE
    while not client.get_source_insights(read["id"]):
        assert time.monotonic() < deadline, "the insight never came"
        time.sleep(0.1)  # polling for the insight job, with a deadline
    by_insights = client.get_sources(notebook, sort_by="insights_count", sort_order="desc")
    assert [s["id"] for s in by_insights][0] == read["id"]
    assert by_insights[0]["insights_count"] == 1
    by_embedding = client.get_sources(notebook, sort_by="embedded", sort_order="asc")
    assert len(by_embedding) == 2  # neither embedded (embed=False): sorted all the same

    (insight,) = client.get_source_insights(read["id"])
    hard_reads(insight, "insight_type", "content", "id", "created", "updated")
    assert client.get_insight(insight["id"])["content"] == insight["content"]
    assert client.delete_insight(insight["id"])
    assert client.delete_source(read["id"])
    with pytest.raises(RuntimeError, match="404"):
        client.get_source(read["id"])


def test_a_server_side_file_path_is_refused_saying_to_upload(client):
    with pytest.raises(RuntimeError, match="400 .*upload the file"):
        client._make_request("POST", "/sources/json", json={"type": "upload", "file_path": "/etc/passwd"})


def test_notes_with_and_without_a_notebook(client):
    notebook = client.create_notebook(f"notes {time.monotonic_ns()}")["id"]
    loose = client.create_note("A note that belongs to no notebook.", title="Loose")
    kept = client.create_note("A note in the notebook.", notebook_id=notebook)
    for note in (loose, kept):
        hard_reads(note, "title", "content", "note_type", "id", "created", "updated")
    assert loose["notebook_id"] is None and kept["notebook_id"] == notebook
    assert [n["id"] for n in client.get_notes(notebook)] == [kept["id"]]
    assert loose["id"] in [n["id"] for n in client.get_notes()]
    assert (
        client.update_note(loose["id"], title="Still loose", content="Edited.", note_type="human")["title"]
        == "Still loose"
    )
    assert client.delete_note(loose["id"])


def test_models_defaults_and_transformations_with_their_model(client, chat_model, llm_nb):
    names = {m["name"] for m in client.get_models("language")}
    assert "fake-chat" in names
    spare = client.create_model(f"spare-{time.monotonic_ns()}", "openai", "language")
    with restored(llm_nb, "/models/defaults") as (defaults,):
        assert set(DEFAULT_SLOTS) <= set(client.get_default_models())
        saved = client.update_default_models(**{**defaults, "default_tools_model": chat_model["id"]})
        assert saved["default_tools_model"] == chat_model["id"]
        assert client.get_default_models()["default_tools_model"] == chat_model["id"]
    assert client.delete_model(spare["id"])

    made = client.create_transformation(f"summary {time.monotonic_ns()}", "Summary", "Short", "Summarize.")
    assert made["model_id"] is None
    for item in client.get_transformations():
        hard_reads(item, "name", "title", "description", "prompt", "apply_default", "id", "created", "updated")
    own_model = llm_nb.post(
        "/models",
        json={"name": "fake-chat-2", "provider": "openai", "type": "language", "credential": chat_model["credential"]},
    ).json()
    changed = client.update_transformation(
        made["id"],
        name=made["name"],
        title="Summary",
        description="Short",
        prompt="Summarize.",
        apply_default=False,
        model_id=own_model["id"],
    )
    assert changed["model_id"] == own_model["id"]
    llm_nb.fake.reset()
    executed = client.execute_transformation(made["id"], "Glaciers carve valleys.")
    assert executed["model_id"] == own_model["id"] and executed["output"]
    assert [r["body"]["model"] for r in llm_nb.fake.requests_to("/chat/completions")] == ["fake-chat-2"]
    cleared = client.update_transformation(made["id"], model_id=None)
    assert cleared["model_id"] is None
    defaults = client.get_default_models()  # the stack is shared: another module may have set them
    default = defaults["default_transformation_model"] or defaults["default_chat_model"]
    assert client.execute_transformation(made["id"], "Again.")["model_id"] == default
    with pytest.raises(RuntimeError, match="404"):
        client.update_transformation(made["id"], model_id="model:nonesuch")
    assert client.delete_transformation(made["id"])


def test_search_and_ask_as_their_client_reads_them(client, chat_model):
    notebook = client.create_notebook(f"ask {time.monotonic_ns()}")["id"]
    source = client.create_source(
        notebook_id=notebook, title="Icebergs", content="Icebergs calve from glaciers that reach the sea."
    )
    hits = client.search("icebergs calve")["results"]
    assert source["id"] in {hit["parent_id"] for hit in hits}

    records = client.ask_stream(question="How do icebergs form?", notebook_id=notebook)
    kinds = [r["type"] for r in records]
    assert kinds[0] == "strategy" and kinds[-2:] == ["final_answer", "complete"]
    assert records[-1]["final_answer"] == records[-2]["content"]  # their complete record carries it

    simple = client.ask_simple("How do icebergs form?", chat_model["id"], chat_model["id"], chat_model["id"])
    assert simple["question"] == "How do icebergs form?" and simple["answer"]

    broken = client.ask_stream(
        question="How do icebergs form?",
        notebook_id=notebook,
        answer_model=chat_model["id"],
        strategy_model=_failing_model(client, chat_model),
    )
    assert broken[-1]["type"] == "error" and broken[-1]["message"]  # their error record's field


def _failing_model(client, chat_model):
    """A model whose provider answers malformed output (the fake's `malformed` mode)."""
    return client._make_request(
        "POST",
        "/models",
        json={
            "name": f"gpt-malformed-{time.monotonic_ns()}",
            "provider": "openai",
            "type": "language",
            "credential": chat_model["credential"],
        },
    )["id"]


def test_credentials_carry_modalities_and_a_decryption_error_or_null(client, llm_nb):
    made = client._make_request(
        "POST",
        "/credentials",
        json={
            "name": f"openai {time.monotonic_ns()}",
            "provider": "openai",
            "api_key": "sk-good",
            "base_url": llm_nb.fake.base_url("openai"),
            "modalities": ["language", "embedding"],
        },
    )
    assert made["modalities"] == ["language", "embedding"] and made["decryption_error"] is None
    listed = {c["id"]: c for c in client._make_request("GET", "/credentials")}
    assert listed[made["id"]]["modalities"] == ["language", "embedding"]
    changed = client._make_request("PUT", f"/credentials/{made['id']}", json={"modalities": ["text_to_speech"]})
    assert changed["modalities"] == ["text_to_speech"]
    with pytest.raises(RuntimeError, match="400"):
        client._make_request("PUT", f"/credentials/{made['id']}", json={"modalities": ["telepathy"]})


def test_sources_sort_by_whether_they_are_embedded(nb):
    """On the stack with the embedding model (their client sends embed=False unless told)."""
    client = OpenNotebookStyleClient(nb.url)
    notebook = client.create_notebook(f"embedded {time.monotonic_ns()}")["id"]
    plain = client.create_source(notebook_id=notebook, title="Plain", content="Basalt is a volcanic rock.")
    embedded = client.create_source(
        notebook_id=notebook, title="Embedded", content="Granite is a plutonic rock.", embed=True
    )
    assert (plain["embedded"], embedded["embedded"]) == (False, True)
    first_desc = client.get_sources(notebook, sort_by="embedded", sort_order="desc")[0]["id"]
    first_asc = client.get_sources(notebook, sort_by="embedded", sort_order="asc")[0]["id"]
    assert (first_desc, first_asc) == (embedded["id"], plain["id"])


SETTINGS_THEY_SEND = (
    "default_content_processing_engine_doc",
    "default_content_processing_engine_url",
    "default_embedding_option",
    "auto_delete_files",
    "youtube_preferred_languages",
)


def test_settings_as_their_service_reads_and_writes_them(client):
    """Their SettingsService: `.get()` of five fields, and an update sending all five back."""
    before = client.get_settings()
    read = {field: before.get(field) for field in SETTINGS_THEY_SEND}
    # The stack is shared: whatever another module left is read, a different value written.
    assert read["default_embedding_option"] in ("ask", "always", "never") and read["auto_delete_files"] in ("yes", "no")
    other = "always" if read["default_embedding_option"] == "never" else "never"
    try:
        saved = client.update_settings(**{**read, "default_embedding_option": other, "auto_delete_files": None})
        assert saved["default_embedding_option"] == other
        assert saved["auto_delete_files"] == read["auto_delete_files"]  # null: unchanged
        with pytest.raises(RuntimeError, match="400 .*default_embedding_option"):
            client.update_settings(default_embedding_option="often")
    finally:
        client.update_settings(**before)
    assert client.get_settings() == before


def test_a_notebook_context_as_their_context_service_asks(client):
    notebook = client.create_notebook(f"context {time.monotonic_ns()}")["id"]
    source = client.create_source(notebook_id=notebook, title="Seracs", content="Seracs are blocks of glacier ice.")
    note = client.create_note("Seracs topple.", notebook_id=notebook)
    whole = client.get_notebook_context(notebook)
    assert [s["id"] for s in whole["sources"]] == [source["id"]] and [n["id"] for n in whole["notes"]] == [note["id"]]
    assert whole["notebook_id"] == notebook and whole["total_tokens"] > 0
    config = {"sources": {source["id"]: "full content"}, "notes": {note["id"]: "not in context"}}
    part = client.get_notebook_context(notebook, config)
    assert "blocks of glacier ice" in part["sources"][0]["content"] and part["notes"] == []
    with pytest.raises(RuntimeError, match="404"):
        client.get_notebook_context("notebook:nosuch")


def test_embedding_and_its_rebuild_as_their_client_asks(nb):
    """On the stack with the embedding model: their EmbeddingService embeds without
    async_processing (it waits here), the rebuild is polled by its status."""
    client = OpenNotebookStyleClient(nb.url)
    notebook = client.create_notebook(f"embed {time.monotonic_ns()}")["id"]
    source = client.create_source(notebook_id=notebook, content="Crevasses open in moving ice.")  # embed=False
    assert source["embedded"] is False
    embedded = client.embed_content(source["id"], "source")
    assert embedded["success"] is True and embedded["item_id"] == source["id"]
    assert client.get_source(source["id"])["embedded"] is True
    note = client.create_note("Crevasses can be bridged by snow.", notebook_id=notebook)
    queued = client.embed_content(note["id"], "note", async_processing=True)
    deadline = time.monotonic() + JOB_DEADLINE
    while (job := client.get_command(queued["command_id"]))["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)  # polling the job, with a deadline, as their UI does
    assert job["job_id"] == queued["command_id"] and job["status"] == "completed"

    # A source embedded by no model (their client's embed=False): what `existing` leaves
    # (it re-embeds other models' vectors only) and `all` embeds.
    stale = client.create_source(notebook_id=notebook, content="Seracs fall from icefalls.")
    assert stale["embedded"] is False
    deadline = time.monotonic() + JOB_DEADLINE
    existing = client.rebuild_embeddings(mode="existing")
    assert existing["command_id"].startswith("command:")
    assert _finished_rebuild(client, existing["command_id"], deadline)["status"] == "completed"
    assert client.get_source(stale["id"])["embedded"] is False
    started = client.rebuild_embeddings(mode="all")
    assert started["total_items"] >= 1 and started["estimated_items"] == started["total_items"]
    status = _finished_rebuild(client, started["command_id"], deadline)
    assert status["status"] == "completed" and status["progress"]["processed"] == status["progress"]["total"]
    assert status["stats"]["sources"] >= 1 and status["stats"]["failed"] == 0, status
    assert client.get_source(stale["id"])["embedded"] is True
    with pytest.raises(RuntimeError, match="400 .*mode"):
        client.rebuild_embeddings(mode="some")


def _finished_rebuild(client, command_id, deadline):
    while (status := client.get_rebuild_status(command_id))["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, status
        time.sleep(0.1)  # polling the rebuild, with a deadline, as their UI does
    return status
