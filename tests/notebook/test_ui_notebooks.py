"""Open Notebook's web UI and onb-mcp on notebooks, sources, notes, settings and
embedding: their calls (under /api, with their bodies: the UI's `frontend/src/lib/api/`
and types, onb-mcp's tools) and the fields they read from each answer; bad inputs a
clear 400/404 that changes nothing. The stack is shared with other modules: every
setting changed here is set back."""

import time

import pytest

from tests.support.notebook import JOB_DEADLINE


def _text_source(nb, notebook_id, content, embed="true", title=None):
    """The UI's add-source dialog: a multipart form, every flag as a string."""
    form = {
        "type": "text",
        "notebooks": f'["{notebook_id}"]',
        "content": content,
        "transformations": "[]",
        "embed": embed,
        "delete_source": "false",
        "async_processing": "false",
    }
    if title:
        form["title"] = title
    added = nb.post("/api/sources", files={name: (None, value) for name, value in form.items()})
    assert added.status_code == 201, added.text
    return added.json()


def _poll(nb, path, done, deadline=JOB_DEADLINE):
    """GET `path` until `done(answer)`, as the UI polls (with a deadline)."""
    end = time.monotonic() + deadline
    while True:
        answer = nb.get(path)
        assert answer.status_code == 200, answer.text
        if done(answer.json()):
            return answer.json()
        assert time.monotonic() < end, f"{path}: {answer.json()}"
        time.sleep(0.1)  # polling, as the UI does, with a deadline


@pytest.fixture
def ui_settings(nb):
    """The settings as they were, set back after the test."""
    before = nb.get("/api/settings").json()
    yield before
    assert nb.put("/api/settings", json=before).status_code == 200


# --------------------------------------------------------------------------- notebooks


def test_two_notebooks_of_one_name_and_the_recently_viewed(nb):
    name = f"Reading list {time.monotonic_ns()}"
    made = [nb.post("/api/notebooks", json={"name": name, "description": ""}) for _ in range(2)]
    assert [m.status_code for m in made] == [201, 201]
    first, second = (m.json()["id"] for m in made)
    source = _text_source(nb, first, "Lichens are fungi living with algae.", embed="false", title="Lichens")

    assert nb.get(f"/api/notebooks/{first}").json()["name"] == name  # the notebook's page: a view
    assert nb.get(f"/api/sources/{source['id']}").status_code == 200  # the source's page: a view
    assert nb.get(f"/api/notebooks/{second}").status_code == 200
    recent = nb.get("/api/recently-viewed", params={"limit": 12}).json()
    mine = [(item["type"], item["id"], item["title"]) for item in recent if item["id"] in (first, second, source["id"])]
    assert mine == [("notebook", second, name), ("source", source["id"], "Lichens"), ("notebook", first, name)]
    stamps = [item["last_viewed_at"] for item in recent]
    assert stamps == sorted(stamps, reverse=True) and all(s.endswith("Z") for s in stamps)
    assert len(nb.get("/api/recently-viewed", params={"limit": 1}).json()) == 1
    for limit in ("0", "51", "many"):
        refused = nb.get("/api/recently-viewed", params={"limit": limit})
        assert refused.status_code == 400 and "limit" in refused.json()["detail"]


def test_an_existing_source_added_to_a_notebook_and_removed(nb):
    home, other = nb.notebook(), nb.notebook()
    source = _text_source(nb, home, "Tardigrades survive the vacuum of space.", embed="false")
    for _ in range(2):  # adding it again changes nothing
        added = nb.post(f"/api/notebooks/{other}/sources/{source['id']}")
        assert added.status_code == 200 and added.json()["message"]
    assert sorted(nb.get(f"/api/sources/{source['id']}").json()["notebooks"]) == sorted([home, other])
    listed = nb.get("/api/sources", params={"notebook_id": other}).json()
    assert [s["id"] for s in listed] == [source["id"]]
    assert nb.get(f"/api/notebooks/{other}").json()["source_count"] == 1

    for _ in range(2):  # the link goes, the source stays; removing it again changes nothing
        removed = nb.delete(f"/api/notebooks/{other}/sources/{source['id']}")
        assert removed.status_code == 200 and removed.json()["message"]
    assert nb.get(f"/api/sources/{source['id']}").json()["notebooks"] == [home]
    assert nb.get("/api/sources", params={"notebook_id": other}).json() == []

    for method in ("POST", "DELETE"):
        unknown_notebook = nb.call(method, f"/api/notebooks/notebook:nosuch/sources/{source['id']}")
        unknown_source = nb.call(method, f"/api/notebooks/{other}/sources/source:nosuch")
        assert unknown_notebook.status_code == 404 and "notebook" in unknown_notebook.json()["detail"]
        assert unknown_source.status_code == 404 and "source" in unknown_source.json()["detail"]
    assert nb.get(f"/api/sources/{source['id']}").json()["notebooks"] == [home]


def test_the_delete_dialog_previews_then_deletes_the_sources_only_it_holds(nb):
    doomed, neighbour = nb.notebook(), nb.notebook()
    only_here = _text_source(nb, doomed, "Only this notebook holds the axolotl.", embed="false")
    shared = _text_source(nb, doomed, "Both notebooks hold the platypus.", embed="false")
    assert nb.post(f"/api/notebooks/{neighbour}/sources/{shared['id']}").status_code == 200
    note = nb.post("/api/notes", json={"content": "A note.", "note_type": "human", "notebook_id": doomed})
    assert note.status_code == 201
    assert nb.post("/api/chat/sessions", json={"notebook_id": doomed, "title": "Amphibians"}).status_code == 201

    preview = nb.get(f"/api/notebooks/{doomed}/delete-preview").json()
    assert preview == {
        "notebook_id": doomed,
        "notebook_name": nb.get(f"/api/notebooks/{doomed}").json()["name"],
        "note_count": 1,
        "exclusive_source_count": 1,
        "shared_source_count": 1,
    }
    deleted = nb.delete(f"/api/notebooks/{doomed}", params={"delete_exclusive_sources": "true"})
    assert deleted.status_code == 200
    counts = ("deleted_notes", "deleted_sources", "unlinked_sources", "deleted_chat_sessions")
    assert [deleted.json()[k] for k in counts] == [1, 1, 1, 1]
    assert deleted.json()["message"]
    assert nb.get(f"/api/sources/{only_here['id']}").status_code == 404
    assert nb.get(f"/api/sources/{shared['id']}").json()["notebooks"] == [neighbour]
    assert nb.get(f"/api/notebooks/{doomed}/delete-preview").status_code == 404
    refused = nb.delete(f"/api/notebooks/{neighbour}", params={"delete_exclusive_sources": "perhaps"})
    assert refused.status_code == 400 and "delete_exclusive_sources" in refused.json()["detail"]
    assert nb.get(f"/api/notebooks/{neighbour}").status_code == 200


def test_the_header_edits_a_notebook_and_an_empty_update_changes_nothing(nb):
    notebook = nb.notebook()
    described = nb.put(f"/api/notebooks/{notebook}", json={"description": "Mosses and ferns"})
    assert described.json()["description"] == "Mosses and ferns"
    cleared = nb.put(f"/api/notebooks/{notebook}", json={})  # the UI's `{description: undefined}`
    assert cleared.status_code == 200 and cleared.json()["description"] == "Mosses and ferns"
    archived = nb.put(f"/api/notebooks/{notebook}", json={"archived": True})
    assert archived.json()["archived"] is True
    for bad, field in (({"name": ""}, "name"), ({"archived": "yes please"}, "archived"), ({"colour": "red"}, "colour")):
        refused = nb.put(f"/api/notebooks/{notebook}", json=bad)
        assert refused.status_code == 400 and field in refused.json()["detail"]
    assert nb.get(f"/api/notebooks/{notebook}").json()["archived"] is True


# --------------------------------------------------------------------------- notes


def test_notes_as_onb_mcp_writes_them_with_topics(nb):
    notebook = nb.notebook()
    made = nb.post(
        "/api/notes",
        json={"notebook_id": notebook, "title": "Spores", "content": "Ferns spread by spores.", "topics": ["ferns"]},
    )
    assert made.status_code == 201, made.text
    assert made.json()["title"] == "Spores" and "topics" not in made.json()  # taken, not kept
    changed = nb.put(f"/api/notes/{made.json()['id']}", json={"content": "Ferns and mosses.", "topics": []})
    assert changed.status_code == 200 and changed.json()["content"] == "Ferns and mosses."
    ai = nb.post(
        "/api/notes", json={"content": "An answer\nworth keeping.", "note_type": "ai", "notebook_id": notebook}
    )
    assert ai.status_code == 201 and ai.json()["title"] == "An answer"  # titled from its content
    for bad, field in (
        ({"content": "x", "topics": "ferns"}, "topics"),
        ({"content": "x", "topics": [1]}, "topics"),
        ({"content": "x", "mood": "calm"}, "mood"),
        ({"content": "x", "note_type": "robot"}, "note_type"),
    ):
        refused = nb.post("/api/notes", json={**bad, "notebook_id": notebook})
        assert refused.status_code == 400 and field in refused.json()["detail"], refused.text
    assert len(nb.get("/api/notes", params={"notebook_id": notebook}).json()) == 2


# --------------------------------------------------------------------------- settings


def test_settings_as_the_settings_page_reads_and_writes_them(nb, ui_settings):
    assert set(ui_settings) == {
        "default_content_processing_engine_doc",
        "default_content_processing_engine_url",
        "default_embedding_option",
        "auto_delete_files",
        "docling_ocr",
        "docling_formulas",
        "docling_vision",
        "youtube_preferred_languages",
    }
    # The form resets itself from the answer only when this one is set.
    assert ui_settings["default_content_processing_engine_doc"] in ("auto", "docling", "simple")
    assert ui_settings["default_embedding_option"] in ("ask", "always", "never")
    changed = nb.put(
        "/api/settings", json={"default_embedding_option": "always", "auto_delete_files": "no", "docling_ocr": False}
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["default_embedding_option"], changed.json()["docling_ocr"]) == ("always", False)
    # Open Notebook's Python client sends every field, null for those it leaves alone.
    kept = nb.put("/api/settings", json={"default_embedding_option": None, "youtube_preferred_languages": ["fr"]})
    assert kept.json()["default_embedding_option"] == "always" and kept.json()["youtube_preferred_languages"] == ["fr"]
    for bad, field in (
        ({"default_embedding_option": "sometimes"}, "default_embedding_option"),
        ({"auto_delete_files": True}, "auto_delete_files"),
        ({"docling_vision": "maybe"}, "docling_vision"),
        ({"youtube_preferred_languages": "fr"}, "youtube_preferred_languages"),
        ({"theme": "dark"}, "theme"),
    ):
        refused = nb.put("/api/settings", json=bad)
        assert refused.status_code == 400 and field in refused.json()["detail"], refused.text
    assert nb.get("/settings").json() == kept.json()  # nothing changed by the refusals; the same without /api


def test_a_source_added_without_embed_follows_default_embedding_option(nb, ui_settings):
    notebook = nb.notebook()

    def added_embedded(content):
        added = nb.post("/api/sources/json", json={"type": "text", "notebook_id": notebook, "content": content})
        assert added.status_code == 201, added.text
        return added.json()["embedded"]

    assert nb.put("/api/settings", json={"default_embedding_option": "never"}).status_code == 200
    assert added_embedded("Never embedded: basalt columns.") is False
    assert _text_source(nb, notebook, "Asked for: obsidian glass.", embed="true")["embedded"] is True
    assert nb.put("/api/settings", json={"default_embedding_option": "ask"}).status_code == 200
    assert added_embedded("Embedded: pumice floats.") is True


def test_auto_delete_files_drops_an_upload_once_processed(nb, ui_settings):
    notebook = nb.notebook()
    assert nb.put("/api/settings", json={"auto_delete_files": "yes"}).status_code == 200
    form = {"type": "upload", "notebook_id": notebook, "embed": "false", "delete_source": "false"}
    added = nb.post(
        "/api/sources", data=form, files={"file": ("geysers.txt", b"Geysers erupt hot water.", "text/plain")}
    )
    assert added.status_code == 201, added.text
    # The worker drops the file just after the job completes: poll for it.
    _poll(nb, f"/api/sources/{added.json()['id']}", lambda s: s["file_available"] is False)
    assert nb.get(f"/api/sources/{added.json()['id']}/download").status_code == 404
    assert nb.put("/api/settings", json={"auto_delete_files": "no"}).status_code == 200
    kept = nb.post("/api/sources", data=form, files={"file": ("vents.txt", b"Vents release steam.", "text/plain")})
    assert kept.json()["file_available"] is True


# --------------------------------------------------------------------------- embedding


def test_the_source_page_embeds_a_source_and_a_note(nb):
    notebook = nb.notebook()
    source = _text_source(nb, notebook, "Stalactites hang from cave ceilings.", embed="false")
    assert source["embedded"] is False
    embedded = nb.post("/api/embed", json={"item_id": source["id"], "item_type": "source", "async_processing": False})
    assert embedded.status_code == 200, embedded.text
    assert embedded.json()["success"] is True and embedded.json()["message"]
    after = nb.get(f"/api/sources/{source['id']}").json()
    assert after["embedded"] is True and after["embedded_chunks"] >= 1
    hits = nb.post("/api/search", json={"query": "cave ceilings", "type": "vector", "notebook_id": notebook}).json()
    assert source["id"] in [hit["parent_id"] for hit in hits["results"]]

    note = nb.post("/api/notes", json={"content": "Stalagmites rise from the floor.", "notebook_id": notebook}).json()
    queued = nb.post("/api/embed", json={"item_id": note["id"], "item_type": "Note", "async_processing": True})
    assert queued.status_code == 202 and queued.json()["command_id"].startswith("command:")
    status = _poll(nb, f"/api/commands/jobs/{queued.json()['command_id']}", lambda c: c["status"] == "completed")
    assert status["job_id"] == queued.json()["command_id"]  # Open Notebook's field
    assert nb.get(f"/api/notes/{note['id']}").json()["embedded"] is True

    for bad, status_code, word in (
        ({"item_id": source["id"], "item_type": "chunk"}, 400, "item_type"),
        ({"item_id": source["id"]}, 400, "item_type"),
        ({"item_id": source["id"], "item_type": "source", "async_processing": "soon"}, 400, "async_processing"),
        ({"item_id": "source:nosuch", "item_type": "source"}, 404, "source"),
        ({"item_id": "note:nosuch", "item_type": "note"}, 404, "note"),
    ):
        refused = nb.post("/api/embed", json=bad)
        assert refused.status_code == status_code and word in refused.json()["detail"], refused.text


def test_the_advanced_page_rebuilds_embeddings_and_onb_mcp_a_notebook(nb):
    started = nb.post(
        "/api/embeddings/rebuild",
        json={"mode": "existing", "include_sources": True, "include_notes": True, "include_insights": True},
    )
    assert started.status_code == 200, started.text
    command_id = started.json()["command_id"]
    assert started.json()["message"] and started.json()["total_items"] == started.json()["estimated_items"]
    status = _poll(nb, f"/api/embeddings/rebuild/{command_id}/status", lambda s: s["status"] in ("completed", "failed"))
    assert status["status"] == "completed" and status["command_id"] == command_id
    assert status["progress"]["processed"] == status["progress"]["total"] and status["progress"]["percentage"] == 100
    assert set(status["stats"]) == {"sources", "notes", "insights", "failed"} and status["stats"]["failed"] == 0
    assert status["started_at"] and status["completed_at"]

    # onb-mcp's rebuild_embeddings(notebook_id): that notebook's sources and notes, mode all.
    notebook = nb.notebook()
    plain = _text_source(nb, notebook, "Drumlins are hills shaped by ice.", embed="false")
    elsewhere = _text_source(nb, nb.notebook(), "Eskers are ridges of gravel.", embed="false")
    job = nb.post("/api/rebuild", json={"notebook_id": notebook})
    assert job.status_code == 200 and job.json()["total_items"] == 1, job.text
    done = _poll(
        nb,
        f"/api/embeddings/rebuild/{job.json()['command_id']}/status",
        lambda s: s["status"] in ("completed", "failed"),
    )
    assert done["status"] == "completed" and done["stats"]["sources"] == 1, done
    assert nb.get(f"/api/sources/{plain['id']}").json()["embedded"] is True
    assert nb.get(f"/api/sources/{elsewhere['id']}").json()["embedded"] is False  # another notebook's

    for path, bad, status_code, word in (
        ("/api/embeddings/rebuild", {"mode": "everything"}, 400, "mode"),
        ("/api/embeddings/rebuild", {"include_notes": "no thanks"}, 400, "include_notes"),
        ("/api/embeddings/rebuild", {"colour": "red"}, 400, "colour"),
        ("/api/rebuild", {"notebook_id": "notebook:nosuch"}, 404, "notebook"),
    ):
        refused = nb.post(path, json=bad)
        assert refused.status_code == status_code and word in refused.json()["detail"], refused.text
    other_command = nb.get(f"/api/sources/{plain['id']}").json()["command_id"]
    assert nb.get(f"/api/embeddings/rebuild/{other_command}/status").status_code == 404
    assert nb.get("/api/embeddings/rebuild/command:nosuch/status").status_code == 404


# --------------------------------------------------------------------------- context


def test_a_notebook_context_in_open_notebook_shape(nb):
    notebook = nb.notebook()
    kept = _text_source(nb, notebook, "Moraines are ridges of rock.", embed="false", title="Moraines")
    left = _text_source(nb, notebook, "Cirques are bowls carved by ice.", embed="false")
    note = nb.post("/api/notes", json={"content": "Remember the moraines.", "notebook_id": notebook}).json()
    config = {
        "sources": {kept["id"]: "full content", left["id"]: "not in context"},
        "notes": {note["id"]: "full content"},
    }
    context = nb.post(f"/api/notebooks/{notebook}/context", json={"notebook_id": notebook, "context_config": config})
    assert context.status_code == 200, context.text
    body = context.json()
    assert body["notebook_id"] == notebook and body["total_tokens"] > 0
    assert [s["id"] for s in body["sources"]] == [kept["id"]] and "ridges of rock" in body["sources"][0]["content"]
    assert [n["id"] for n in body["notes"]] == [note["id"]]
    everything = nb.post(f"/api/notebooks/{notebook}/context", json={"notebook_id": notebook}).json()
    assert len(everything["sources"]) == 2 and len(everything["notes"]) == 1
    # Open Notebook's route leaves out an item whose mode says "not in" (its UI's word).
    ui_words = {"sources": {kept["id"]: "insights", left["id"]: "not in"}, "notes": {note["id"]: "not in"}}
    worded = nb.post(f"/api/notebooks/{notebook}/context", json={"context_config": ui_words}).json()
    assert [s["id"] for s in worded["sources"]] == [kept["id"]] and worded["notes"] == []
    assert worded["sources"][0]["mode"] == "insights"
    refused = nb.post(
        f"/api/notebooks/{notebook}/context", json={"context_config": {"sources": {kept["id"]: "summarised"}}}
    )
    assert refused.status_code == 400 and "context_config" in refused.json()["detail"]
    assert nb.post("/api/notebooks/notebook:nosuch/context", json={}).status_code == 404
