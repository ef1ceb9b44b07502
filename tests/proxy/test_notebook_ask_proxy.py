"""The notebook's ask stream through the real nginx site: each record reaches the
client when the service writes it, nothing buffers the stream."""

import time

import pytest
import requests

from app.common.sse_client import iter_records
from devtools.fake_providers import FakeProviders
from tests.support.notebook import AUTH, ENCRYPTION_KEY, LLM_TIMEOUT, PROVIDER_HOST, start_stack, stop_stack


@pytest.fixture(scope="module")
def notebook_with_models(tmp_path_factory):
    with FakeProviders(host=PROVIDER_HOST, drip_seconds=LLM_TIMEOUT * 3) as fake:
        client = start_stack(
            tmp_path_factory.mktemp("notebook-ask-proxy") / "data",
            NOTEBOOK_ENCRYPTION_KEY=ENCRYPTION_KEY,
            NOTEBOOK_EMBEDDING_PROVIDER="none",
            NOTEBOOK_MODEL_HOST_ALLOWLIST=f"{PROVIDER_HOST}/32",
            NOTEBOOK_LLM_TIMEOUT=str(LLM_TIMEOUT),
        )
        try:
            cred = client.post(
                "/credentials",
                json={"name": "fake", "provider": "openai_compatible", "base_url": fake.base_url("openai")},
            ).json()
            made = {
                name: client.post(
                    "/models",
                    json={"name": name, "provider": "openai_compatible", "type": "language", "credential": cred["id"]},
                ).json()
                for name in ("fake-chat", "fake-chat-slow")
            }
            client.post("/models/config", json={"default_chat_model": made["fake-chat"]["id"]})
            notebook = client.notebook()
            client.post(
                "/sources", json={"type": "text", "notebook_id": notebook, "content": "Glaciers carve valleys."}
            ).raise_for_status()
            client.models, client.notebook_id = made, notebook
            yield client
        finally:
            stop_stack(client)


@pytest.mark.parametrize("path", ["/api/ask", "/api/search/ask"])  # ours, and Open Notebook's (its UI's proxy)
def test_ask_records_are_not_buffered_by_nginx(notebook_with_models, nginx_for, path):
    nb = notebook_with_models
    proxy = nginx_for(nb.service)
    started = time.monotonic()
    # The answer model drips until the time-out: the strategy record must arrive long before the end.
    response = requests.post(
        proxy.url + path,
        headers=proxy.headers("notebook", **AUTH),
        stream=True,
        json={
            "question": "How do glaciers work?",
            "notebook_id": nb.notebook_id,
            "answer_model": nb.models["fake-chat-slow"]["id"],
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    arrivals = [(time.monotonic() - started, record.json()) for record in iter_records(response)]
    kinds = [record["type"] for _, record in arrivals]
    assert kinds == ["strategy", "error"], arrivals
    strategy_at, error_at = arrivals[0][0], arrivals[1][0]
    assert error_at >= LLM_TIMEOUT and error_at - strategy_at > LLM_TIMEOUT - 1.0
    assert "did not answer within" in arrivals[1][1]["detail"]
