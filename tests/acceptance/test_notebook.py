"""Research notebook, checked through its public address (nginx in front), as an
anonymous client: health, the interactive documentation with its own Swagger UI
files, the OpenAPI document, and no data without the password."""


def test_health(notebook):
    response = notebook.get("/health")
    assert response.status_code == 200 and response.json()["status"] == "healthy"


def test_docs_are_served_from_the_bundles_own_files(notebook):
    page = notebook.get("/docs")
    assert page.status_code == 200 and "/docs/ui/swagger-ui-bundle.js" in page.text
    bundle = notebook.get("/docs/ui/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and "javascript" in bundle.headers["Content-Type"]


def test_the_openapi_document_names_the_model_routes(notebook):
    paths = notebook.get("/openapi.json").json()["paths"]
    assert {"/ask", "/credentials", "/models", "/chat/execute", "/podcasts/generate"} <= set(paths)


def test_no_data_without_the_password(notebook):
    for path in ("/notebooks", "/credentials", "/api/models"):
        response = notebook.get(path)
        assert response.status_code == 401 and "detail" in response.json(), path
