"""Configuration seen from outside: the password rule at start, no embedding model,
CORS, and the documentation."""

import os
import subprocess

import pytest
import requests

from devtools import services
from tests.support.notebook import PASSWORD, notebook_env
from tests.support.shared import ROOT


def test_refuses_to_start_without_password(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOK_")}
    env.update(SERVICE="notebook", PORT=str(services.free_port()), DATA_DIR=str(tmp_path))
    done = subprocess.run(
        [str(services.GUNICORN), "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert b"NOTEBOOK_PASSWORD is not set" in done.stderr


@pytest.fixture(scope="module")
def open_service(start_module_service, tmp_path_factory):
    """No password (allowed explicitly), no embedding model, CORS for one origin."""
    data_dir = tmp_path_factory.mktemp("notebook-open")
    env = notebook_env(
        data_dir,
        NOTEBOOK_PASSWORD="",
        NOTEBOOK_ALLOW_NO_PASSWORD="1",
        NOTEBOOK_EMBEDDING_PROVIDER="none",
        NOTEBOOK_CORS_ORIGINS="https://app.example.org",
    )
    return start_module_service("notebook", data_dir=data_dir, env=env)


def test_without_password_when_allowed(open_service):
    assert requests.get(open_service.base_url + "/notebooks", timeout=10).status_code == 200


def test_vector_search_without_model_is_400(open_service):
    url = open_service.base_url
    notebook = requests.post(url + "/notebooks", json={"name": "no model"}, timeout=10).json()["id"]
    added = requests.post(
        url + "/sources",
        json={"type": "text", "notebook_id": notebook, "content": "Saturn has rings.", "async_processing": True},
        timeout=10,
    )
    assert added.status_code == 202  # still accepted: processed without embeddings by a worker
    response = requests.post(url + "/search", json={"query": "rings", "type": "vector"}, timeout=10)
    assert response.status_code == 400
    assert "embedding model" in response.json()["detail"]
    text = requests.post(url + "/search", json={"query": "rings", "type": "text"}, timeout=10)
    assert text.status_code == 200  # text search does not need the model


def test_cors_allows_configured_origin_only(open_service):
    url = open_service.base_url + "/notebooks"
    preflight = requests.options(
        url,
        headers={
            "Origin": "https://app.example.org",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
        timeout=10,
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example.org"
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    simple = requests.get(url, headers={"Origin": "https://app.example.org"}, timeout=10)
    assert simple.headers["Access-Control-Allow-Origin"] == "https://app.example.org"
    other = requests.get(url, headers={"Origin": "https://evil.example.com"}, timeout=10)
    assert "Access-Control-Allow-Origin" not in other.headers
    refused = requests.options(
        url, headers={"Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"}, timeout=10
    )
    assert refused.status_code == 403 and refused.json()["detail"]


def test_no_cors_headers_by_default(nb):
    response = nb.get("/notebooks", headers={"Origin": "https://app.example.org"})
    assert "Access-Control-Allow-Origin" not in response.headers


def test_docs_and_openapi(nb):
    page = requests.get(nb.url + "/docs", timeout=10)
    assert page.status_code == 200 and "swagger-ui-bundle.js" in page.text and "//cdn" not in page.text
    for asset in ("/docs/ui/swagger-ui-bundle.js", "/docs/ui/swagger-ui.css", "/docs/assets/docs.js"):
        assert requests.get(nb.url + asset, timeout=10).status_code == 200, asset
    assert requests.get(nb.url + "/docs/ui/package.json", timeout=10).status_code == 404
    document = requests.get(nb.url + "/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.")
    assert {"/notebooks", "/sources", "/sources/{source_id}/retry", "/search", "/commands/{command_id}"} <= set(
        document["paths"]
    )
    create = document["components"]["schemas"]["NotebookCreate"]
    assert create["properties"]["name"]["maxLength"] == 200 and "name" in create["required"]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert PASSWORD not in requests.get(nb.url + "/openapi.json", timeout=10).text
