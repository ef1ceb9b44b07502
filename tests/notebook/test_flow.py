"""The typical flow through the running service and worker: a notebook, a PDF, a
text and a link (served by a local HTTP server), the commands, text and vector
search, the results, and the original file downloaded again."""

from tests.support import documents


def _hits(response):
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total_count"] == len(body["results"])
    return [hit["id"] for hit in body["results"]], body


def test_typical_flow(nb, notebook_id):
    pdf = documents.pdf_bytes(documents.PDF_TEXT)
    # A PDF, synchronously: the answer is the processed source.
    added = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id},
        files={"file": ("cell biology.pdf", pdf, "application/pdf")},
    )
    assert added.status_code == 201, added.text
    pdf_source = added.json()
    assert pdf_source["status"] is None and pdf_source["command_id"] is None  # done: no job to follow
    assert "powerhouse of the cell" in pdf_source["full_text"]
    assert pdf_source["embedded"] and pdf_source["embedded_chunks"] >= 1
    assert pdf_source["notebooks"] == [notebook_id]
    assert pdf_source["asset"] == {"file_path": "cell biology.pdf", "file_name": "cell biology.pdf", "url": None}
    stored = nb.get(f"/sources/{pdf_source['id']}").json()
    assert pdf_source["id"].startswith("source:") and stored["command_id"].startswith("command:")
    assert stored["status"] == "completed"

    # A text and a link, asynchronously (JSON body): answered at once with the command.
    text = nb.post(
        "/sources",
        json={
            "type": "text",
            "notebooks": [notebook_id],
            "title": "Plants",
            "content": documents.TEXT_BODY,
            "async_processing": True,
        },
    )
    link = nb.post(
        "/api/sources",
        json={
            "type": "link",
            "notebook_id": notebook_id,
            "url": nb.links.base_url + "/article.html",
            "async_processing": True,
        },
    )
    for response in (text, link):
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "new" and response.json()["command_id"].startswith("command:")
        assert response.json()["id"].startswith("source:") and "full_text" in response.json()
    for response in (text, link):
        command = nb.wait_command(response.json()["command_id"])
        assert command["status"] == "completed", command
        assert command["result"]["embedded_chunks"] >= 1
        assert command["result"]["embedding_model"] == "all-MiniLM-L6-v2"

    link_source = nb.get(f"/sources/{link.json()['id']}").json()
    assert link_source["title"] == "Coral reefs under pressure"
    assert "bleaching" in link_source["full_text"] and "Copyright" not in link_source["full_text"]
    assert nb.get(f"/sources/{text.json()['id']}/status").json()["status"] == "completed"

    listed = nb.get(f"/sources?notebook_id={notebook_id}&sort_by=title&sort_order=asc")
    assert listed.status_code == 200 and listed.headers["X-Total-Count"] == "3"
    assert [s["title"] for s in listed.json()] == sorted((s["title"] for s in listed.json()), key=str.lower)

    # Text search: BM25 over titles and chunks, one hit per source, scoped to the notebook.
    ids, body = _hits(nb.post("/search", json={"query": "coral bleaching", "type": "text", "notebook_id": notebook_id}))
    assert ids[0] == link.json()["id"] and body["search_type"] == "text"
    assert body["results"][0]["relevance"] > 0 and body["results"][0]["matches"]
    ids, _ = _hits(nb.post("/search", json={"query": "mitochondria", "notebook_id": notebook_id}))
    assert ids == [pdf_source["id"]]

    # Vector search: the meaning, not the words.
    ids, body = _hits(
        nb.post(
            "/search",
            json={
                "query": "how do leaves turn sunshine into sugar",
                "type": "vector",
                "notebook_id": notebook_id,
                "minimum_score": 0.1,
            },
        )
    )
    assert ids[0] == text.json()["id"], body
    assert body["results"][0]["similarity"] > 0.3 and body["search_type"] == "vector"
    ids, _ = _hits(
        nb.post(
            "/search",
            json={
                "query": "energy currency made by organelles in cells",
                "type": "vector",
                "notebook_id": notebook_id,
                "minimum_score": 0.1,
                "search_notes": False,
            },
        )
    )
    assert ids[0] == pdf_source["id"]

    # The original, byte for byte, as an attachment.
    download = nb.get(f"/sources/{pdf_source['id']}/download")
    assert download.status_code == 200 and download.content == pdf
    assert "attachment" in download.headers["Content-Disposition"]
    assert nb.get(f"/sources/{text.json()['id']}/download").status_code == 404

    notebook = nb.get(f"/notebooks/{notebook_id}").json()
    assert notebook["source_count"] == 3


def test_docx_and_markdown_uploads(nb, notebook_id):
    docx = documents.docx_bytes(["Quantum entanglement links particles.", "Bell tests confirm it."])
    added = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
        files={"file": ("physics.docx", docx)},
    )
    assert added.status_code == 201, added.text
    assert "Bell tests confirm it." in added.json()["full_text"]
    assert added.json()["embedded"] is False
    markdown = nb.post(
        "/sources",
        data={"type": "upload", "notebooks": f'["{notebook_id}"]', "embed": "false"},
        files={"file": ("notes.md", b"# Orbital mechanics\n\nKepler's laws describe orbits.")},
    )
    assert markdown.status_code == 201, markdown.text
    assert markdown.json()["title"] == "Orbital mechanics"
    ids, _ = _hits(nb.post("/search", json={"query": "kepler orbits", "notebook_id": notebook_id}))
    assert ids == [markdown.json()["id"]]


def test_notes_are_searchable_and_scoped(nb, notebook_id):
    other = nb.notebook()
    created = nb.post(
        "/notes", json={"content": "Tardigrades survive the vacuum of space.\nMore.", "notebook_id": notebook_id}
    )
    assert created.status_code == 201, created.text
    note = created.json()
    assert note["title"] == "Tardigrades survive the vacuum of space." and note["note_type"] == "human"
    assert (
        nb.post(
            "/notes",
            json={
                "content": "Tardigrades in another notebook",
                "notebook_id": other,
                "note_type": "ai",
                "title": "elsewhere",
            },
        ).status_code
        == 201
    )
    ids, _ = _hits(nb.post("/search", json={"query": "tardigrades", "notebook_id": notebook_id}))
    assert ids == [note["id"]]
    ids, _ = _hits(nb.post("/search", json={"query": "tardigrades", "search_notes": False}))
    assert note["id"] not in ids

    listed = nb.get(f"/api/notes?notebook_id={notebook_id}").json()
    assert [n["id"] for n in listed] == [note["id"]]
    updated = nb.put(f"/notes/{note['id']}", json={"content": "Water bears are tough animals."})
    assert updated.status_code == 200 and updated.json()["content"] == "Water bears are tough animals."
    ids, _ = _hits(nb.post("/search", json={"query": "water bears", "notebook_id": notebook_id}))
    assert ids == [note["id"]]
    # The worker embeds the note: then vector search finds it.
    embedded = [
        c
        for c in nb.get("/commands?limit=100").json()["commands"]
        if c["target"] == note["id"] and c["type"] == "embed_note"
    ]
    assert embedded and all(nb.wait_command(c["id"])["status"] in ("completed", "canceled") for c in embedded)
    assert nb.get(f"/notes/{note['id']}").json()["embedded"] is True
    ids, _ = _hits(
        nb.post(
            "/search",
            json={
                "query": "resilient micro animals",
                "type": "vector",
                "notebook_id": notebook_id,
                "minimum_score": 0.1,
            },
        )
    )
    assert ids == [note["id"]]

    assert nb.delete(f"/notes/{note['id']}").json() == {"deleted": note["id"]}
    assert nb.get(f"/notes/{note['id']}").status_code == 404
    ids, _ = _hits(nb.post("/search", json={"query": "water bears", "notebook_id": notebook_id}))
    assert ids == []


def test_notebook_crud_and_delete_semantics(nb):
    first, second = nb.notebook(), nb.notebook()
    assert nb.put(f"/notebooks/{first}", json={"description": "changed", "archived": True}).json()["archived"]
    shared = nb.post(
        "/sources", json={"type": "text", "notebooks": [first, second], "content": "Shared facts.", "embed": False}
    ).json()
    own = nb.post(
        "/sources", json={"type": "text", "notebook_id": first, "content": "Own facts.", "embed": False}
    ).json()
    nb.post("/notes", json={"content": "a note", "notebook_id": first})
    deleted = nb.delete(f"/notebooks/{first}")
    assert deleted.status_code == 200
    # By default a source that only this notebook held is kept (in no notebook), and the answer says so.
    body = deleted.json()
    assert {k: v for k, v in body.items() if k != "message"} == {
        "deleted": first,
        "deleted_notes": 1,
        "deleted_sources": 0,
        "unlinked_sources": 1,
        "deleted_chat_sessions": 0,
        "kept_sources": 1,
    }
    assert "1 source(s) that only it held kept" in body["message"]
    assert nb.get(f"/sources/{own['id']}").json()["notebooks"] == []
    assert nb.get(f"/sources/{shared['id']}").json()["notebooks"] == [second]
    assert nb.get(f"/notebooks/{first}").status_code == 404
    # Asked to, it deletes them.
    third = nb.notebook()
    mine = nb.post(
        "/sources", json={"type": "text", "notebook_id": third, "content": "Mine only.", "embed": False}
    ).json()
    gone = nb.delete(f"/notebooks/{third}", params={"delete_exclusive_sources": "true"}).json()
    assert (gone["deleted_sources"], gone["kept_sources"], gone["unlinked_sources"]) == (1, 0, 0)
    assert nb.get(f"/sources/{mine['id']}").status_code == 404
    assert nb.delete(f"/notebooks/{second}", params={"delete_exclusive_sources": "maybe"}).status_code == 400
    assert nb.get(f"/notebooks/{second}").status_code == 200  # a bad parameter changes nothing


def test_api_prefix_serves_the_same_routes(nb, notebook_id):
    plain = nb.get(f"/notebooks/{notebook_id}")
    prefixed = nb.get(f"/api/notebooks/{notebook_id}")
    assert plain.status_code == prefixed.status_code == 200 and plain.json() == prefixed.json()
    assert nb.get("/api/health", auth=False).json() == {"status": "healthy"}
