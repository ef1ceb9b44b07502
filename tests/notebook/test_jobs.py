"""Background jobs through the real worker: sync and async adds, failures that
stay failed, retry, cancel on delete while queued, DELETE /commands."""

from tests.support import documents


def _add_async(nb, notebook_id, **fields):
    response = nb.post("/sources", json={"notebook_id": notebook_id, "async_processing": True, **fields})
    assert response.status_code == 202, response.text
    return response.json()


def _slow_link(nb, notebook_id, seconds=3):
    """A job that occupies the (single-threaded) worker for `seconds`."""
    return _add_async(nb, notebook_id, type="link", url=f"{nb.links.base_url}/slow?seconds={seconds}", embed=False)


def test_failed_stays_failed_and_retry_processes_again(nb, notebook_id):
    nb.links.state["flaky_ok"] = False
    added = _add_async(nb, notebook_id, type="link", url=nb.links.base_url + "/flaky")
    command = nb.wait_command(added["command_id"])
    assert command["status"] == "failed" and "503" in command["error_message"]
    status = nb.get(f"/sources/{added['id']}/status").json()
    assert status["status"] == "failed" and "503" in status["error_message"]

    nb.links.state["flaky_ok"] = True
    retried = nb.post(f"/sources/{added['id']}/retry")
    assert retried.status_code == 202, retried.text
    assert retried.json()["id"] == added["id"] and retried.json()["command_id"] != added["command_id"]
    # The whole source, as an asynchronous add answers it: queued again, with its new command.
    assert retried.json()["status"] == "new" and retried.json()["asset"]["url"].endswith("/flaky")
    assert retried.json()["notebooks"] == [notebook_id] and "full_text" in retried.json()
    # While it is queued or running, a second retry is refused: one job per source at a time.
    again = nb.post(f"/sources/{added['id']}/retry")
    final = nb.wait_command(retried.json()["command_id"])
    assert final["status"] == "completed", final
    assert again.status_code == 400, again.text  # queued, running or already completed: never twice
    assert "volcanoes" in nb.get(f"/sources/{added['id']}").json()["full_text"]
    # A completed source is not retried either.
    assert nb.post(f"/sources/{added['id']}/retry").status_code == 400


def test_retry_while_queued_is_refused(nb, notebook_id):
    blocker = _slow_link(nb, notebook_id, seconds=2)
    queued = _add_async(nb, notebook_id, type="text", content="Queued behind the slow page.", embed=False)
    refused = nb.post(f"/sources/{queued['id']}/retry")
    assert refused.status_code == 400 and "new" in refused.json()["detail"]
    assert nb.wait_command(queued["command_id"])["status"] == "completed"
    assert nb.wait_command(blocker["command_id"])["status"] == "completed"


def test_delete_during_queued_job_cancels_it_and_the_worker_goes_on(nb, notebook_id):
    blocker = _slow_link(nb, notebook_id, seconds=3)
    doomed = _add_async(nb, notebook_id, type="text", content="This source is deleted while queued.")
    after = _add_async(nb, notebook_id, type="text", content="This one comes after the deleted one.", embed=False)
    deleted = nb.delete(f"/sources/{doomed['id']}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["canceled_command"] == doomed["command_id"]
    assert nb.wait_command(doomed["command_id"])["status"] == "canceled"
    assert nb.wait_command(blocker["command_id"])["status"] == "completed"
    assert nb.wait_command(after["command_id"])["status"] == "completed"
    assert nb.get(f"/sources/{doomed['id']}").status_code == 404
    # It was skipped for good: still canceled once everything ahead of it ran.
    assert nb.get(f"/commands/{doomed['command_id']}").json()["status"] == "canceled"


def test_cancel_a_queued_command(nb, notebook_id):
    blocker = _slow_link(nb, notebook_id, seconds=2)
    queued = _add_async(nb, notebook_id, type="text", content="Canceled through the commands route.")
    canceled = nb.delete(f"/commands/{queued['command_id']}")
    assert canceled.status_code == 200 and canceled.json()["status"] == "canceled"
    assert nb.get(f"/sources/{queued['id']}/status").json()["status"] == "canceled"
    assert nb.wait_command(blocker["command_id"])["status"] == "completed"
    assert nb.get(f"/commands/{queued['command_id']}").json()["status"] == "canceled"
    # Finished: no second cancel; the canceled source can be processed again.
    assert nb.delete(f"/commands/{queued['command_id']}").status_code == 409
    retried = nb.post(f"/sources/{queued['id']}/retry")
    assert retried.status_code == 202
    assert nb.wait_command(retried.json()["command_id"])["status"] == "completed"
    listed = nb.get("/commands?status=canceled&limit=100").json()
    assert queued["command_id"] in [c["id"] for c in listed["commands"]]


def test_corrupt_pdf_async_fails_and_sync_changes_nothing(nb, notebook_id):
    corrupt = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage without end"
    added = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "async_processing": "true"},
        files={"file": ("broken.pdf", corrupt, "application/pdf")},
    )
    assert added.status_code == 202, added.text
    command = nb.wait_command(added.json()["command_id"])
    assert command["status"] == "failed" and "PDF" in command["error_message"]
    assert nb.get(f"/sources/{added.json()['id']}").json()["status"] == "failed"

    before = nb.get(f"/sources?notebook_id={notebook_id}").headers["X-Total-Count"]
    uploads_before = sorted(p.name for p in (nb.data_dir / "uploads").iterdir())
    sync = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id},
        files={"file": ("broken-again.pdf", corrupt, "application/pdf")},
    )
    assert sync.status_code == 400 and "PDF" in sync.json()["detail"]
    assert nb.get(f"/sources?notebook_id={notebook_id}").headers["X-Total-Count"] == before
    assert sorted(p.name for p in (nb.data_dir / "uploads").iterdir()) == uploads_before


def test_delete_removes_file_chunks_and_index(nb, notebook_id):
    added = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
        files={"file": ("zebra.txt", b"Zebras have black and white stripes.")},
    )
    assert added.status_code == 201, added.text
    source = added.json()
    stored = list((nb.data_dir / "uploads").glob("zebra*.txt"))
    assert len(stored) == 1
    assert [
        h["id"] for h in nb.post("/search", json={"query": "zebras", "notebook_id": notebook_id}).json()["results"]
    ] == [source["id"]]
    deleted = nb.delete(f"/sources/{source['id']}").json()
    assert deleted["file_removed"] is True and deleted["chunks"] == 1
    assert not stored[0].exists()
    assert nb.post("/search", json={"query": "zebras", "notebook_id": notebook_id}).json()["results"] == []
    assert nb.delete(f"/sources/{source['id']}").status_code == 404


def test_sync_text_source(nb, notebook_id):
    added = nb.post("/sources", json={"type": "text", "notebook_id": notebook_id, "content": documents.TEXT_BODY})
    assert added.status_code == 201, added.text
    # Done when answered: no job to follow in the answer; the source itself says it completed.
    assert added.json()["status"] is None and added.json()["command_id"] is None
    assert added.json()["embedded_chunks"] == 1
    assert nb.get(f"/sources/{added.json()['id']}").json()["status"] == "completed"
