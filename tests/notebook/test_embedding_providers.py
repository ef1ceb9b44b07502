"""The other embedding set-ups, each with its own service and worker: a host
without the local model's packages, and an OpenAI-compatible endpoint."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.fake_providers import FakeProviders
from tests.support.notebook import Worker, start_stack, stop_stack
from tests.support.shared import ROOT

WITHOUT_TORCH = Path(__file__).parent / "without_torch"


@pytest.fixture
def stack_without_torch(tmp_path):
    client = start_stack(tmp_path / "data", PYTHONPATH=str(WITHOUT_TORCH))
    yield client
    stop_stack(client)


def test_without_the_model_packages_vector_search_says_so(stack_without_torch):
    nb = stack_without_torch
    notebook = nb.notebook()
    added = nb.post("/sources", json={"type": "text", "notebook_id": notebook, "content": "Comets have tails."})
    assert added.status_code == 201, added.text  # processed all the same, without embeddings
    assert added.json()["embedded"] is False
    command_id = nb.get(f"/sources/{added.json()['id']}").json()["command_id"]
    command = nb.get(f"/commands/{command_id}").json()
    assert command["status"] == "completed" and "not installed" in command["result"]["embedding"]
    vector = nb.post("/search", json={"query": "comets", "type": "vector"})
    assert vector.status_code == 400
    assert "embedding model" in vector.json()["detail"] and "not installed" in vector.json()["detail"]
    text = nb.post("/search", json={"query": "comets", "notebook_id": notebook}).json()
    assert [hit["id"] for hit in text["results"]] == [added.json()["id"]]
    assert "vector search is unavailable" in nb.worker.log_text()


@pytest.fixture
def openai_stack(tmp_path):
    with FakeProviders(keys={"openai": "sk-test"}) as fake:
        client = start_stack(
            tmp_path / "data",
            NOTEBOOK_EMBEDDING_PROVIDER="openai",
            NOTEBOOK_EMBEDDING_URL=fake.base_url("openai"),
            NOTEBOOK_EMBEDDING_API_KEY="sk-test",
            NOTEBOOK_EMBEDDING_MODEL="fake-embed-1",
        )
        client.fake = fake
        yield client
        stop_stack(client)


def test_openai_compatible_endpoint(openai_stack):
    nb = openai_stack
    notebook = nb.notebook()
    volcano = nb.post(
        "/sources", json={"type": "text", "notebook_id": notebook, "content": "Volcanoes erupt molten lava and ash."}
    )
    tides = nb.post(
        "/sources", json={"type": "text", "notebook_id": notebook, "content": "The moon pulls the ocean into tides."}
    )
    for response in (volcano, tides):
        assert response.status_code == 201, response.text
        assert response.json()["embedded_chunks"] == 1
    command_id = nb.get(f"/sources/{volcano.json()['id']}").json()["command_id"]
    command = nb.get(f"/commands/{command_id}").json()
    assert command["result"]["embedding_model"] == "fake-embed-1"
    hits = nb.post(
        "/search", json={"query": "lava and ash", "type": "vector", "notebook_id": notebook, "minimum_score": 0.2}
    ).json()["results"]
    assert [hit["id"] for hit in hits] == [volcano.json()["id"]]
    sent = nb.fake.requests_to("/embeddings")
    assert sent and all(
        seen["authorization"] == "Bearer sk-test" and seen["body"]["model"] == "fake-embed-1" for seen in sent
    )


def test_reembed_after_a_model_change(openai_stack):
    """Vectors record their model: after a change, `reembed` queues the rebuild of what
    the new model has not embedded, and vectors of one model are never compared with
    another's."""
    nb = openai_stack
    notebook = nb.notebook()
    added = nb.post(
        "/sources",
        json={
            "type": "text",
            "notebook_id": notebook,
            "embed": False,
            "content": "Glaciers carve valleys out of rock.",
        },
    )
    assert added.status_code == 201 and added.json()["embedded_chunks"] == 0
    env = nb.env
    queued = subprocess.run(
        [sys.executable, "-m", "app.notebook", "reembed"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert queued.returncode == 0 and "queued 1 source(s)" in queued.stdout, queued.stderr
    command = _command_for(nb, "embeddings", "rebuild_embeddings")  # the job POST /embeddings/rebuild queues
    done = nb.wait_command(command)["result"]
    assert (done["embedding_model"], done["sources"], done["failed"]) == ("fake-embed-1", 1, 0)
    status = nb.get(f"/embeddings/rebuild/{command}/status").json()
    assert status["status"] == "completed" and status["stats"]["sources"] == 1
    query = {"query": "glaciers carve valleys", "type": "vector", "notebook_id": notebook}
    assert [h["id"] for h in nb.post("/search", json=query).json()["results"]] == [added.json()["id"]]

    # The model changes (worker and command line); the service still asks with the old one.
    nb.worker.stop()
    env2 = {**env, "NOTEBOOK_EMBEDDING_MODEL": "fake-embed-2"}
    nb.worker = Worker(nb.data_dir, env2)
    queued = subprocess.run(
        [sys.executable, "-m", "app.notebook", "reembed"],
        cwd=ROOT,
        env={**os.environ, **env2},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "queued 1 source(s)" in queued.stdout, queued.stderr
    command = _command_for(nb, "embeddings", "rebuild_embeddings", skip=1)
    assert nb.wait_command(command)["result"]["embedding_model"] == "fake-embed-2"
    # Same dimension, other model: not compared, so no hit (and no wrong hit).
    assert nb.post("/search", json=query).json()["results"] == []


def _command_for(nb, target, kind, skip=0):
    commands = [
        c["id"] for c in nb.get("/commands?limit=100").json()["commands"] if c["target"] == target and c["type"] == kind
    ]
    assert len(commands) > skip, commands
    return commands[0]  # newest first
