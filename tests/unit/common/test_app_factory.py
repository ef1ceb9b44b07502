"""The process contract: SERVICE selects the service, DATA_DIR its data, errors are JSON."""

import importlib
from pathlib import Path

import pytest

from app import SERVICES, UnknownService, create_app, registry
from app.common import config

ROOT = Path(__file__).resolve().parents[3]


def test_the_registry_lists_each_service_package_once_with_its_own_port():
    """services.json names every service package of the checkout once; the app factory,
    gunicorn.conf.py, the dev runner and the playbook take the list from there."""
    packages = {p.parent.name for p in (ROOT / "app").glob("*/__init__.py")} - {"common", "backup"}
    assert SERVICES == registry.NAMES
    assert set(registry.NAMES) == packages
    assert len(set(registry.PORTS.values())) == len(registry.PORTS)
    assert registry.service("notebook").port == 5055 and registry.service("notebook").worker
    redis_dbs = [s.redis_db for s in registry.SERVICES if s.redis_db is not None]
    assert len(set(redis_dbs)) == len(redis_dbs)
    readers = {p.parent.name for p in (ROOT / "app").glob("*/settings.py") if "DATABASE_URL" in p.read_text()}
    assert {s.name for s in registry.SERVICES if s.database} == readers
    for entry in registry.SERVICES:  # a database service names its schema history's module
        if entry.migrations:
            history = importlib.import_module(entry.migrations)
            assert history.HISTORY.steps and callable(history.open_database), entry.name


def test_create_app_rejects_unknown_service():
    with pytest.raises(UnknownService, match="expected one of"):
        create_app("nope")


def test_data_dir_blank_means_default_and_is_absolute(monkeypatch, tmp_path):
    monkeypatch.setenv("DATA_DIR", "  ")
    assert config.data_dir("decks") == str(ROOT / "var" / "decks")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATA_DIR", "rel/dir")
    assert config.data_dir("decks") == str(tmp_path / "rel" / "dir")


def test_creating_the_app_writes_nothing(tmp_path):
    create_app("decks", {"DATA_DIR": str(tmp_path / "data")})
    assert not (tmp_path / "data").exists()


def test_404_and_405_have_the_service_error_body(decks_client):
    missing = decks_client.get("/no/such/route")
    assert missing.status_code == 404
    assert missing.get_json() == {"error": "not found: /no/such/route"}
    wrong = decks_client.delete("/api/decks")
    assert wrong.status_code == 405
    assert wrong.get_json()["error"].startswith("method DELETE is not allowed")
    assert "GET" in wrong.headers["Allow"]


def test_every_response_has_a_request_id(decks_client):
    assert len(decks_client.get("/healthz").headers["X-Request-Id"]) == 32
    echoed = decks_client.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert echoed.headers["X-Request-Id"] == "abc-123"


def test_security_headers_a_route_may_relax_and_the_app_proxy_goes_without(tmp_path):
    """The policy's one place (app.common.headers): every answer gets it, a route
    decorated with content_security_policy() gets its own, a CSP a route set itself
    stays, and an answer marked as an app's (the workspace's app proxy) gets none."""
    from flask import make_response, request

    from app.common.headers import APP_PROXY, content_security_policy

    flask_app = create_app("decks", {"DATA_DIR": str(tmp_path)})

    @flask_app.get("/test/relaxed")
    @content_security_policy(style_src_elem="'self' 'unsafe-inline'")
    def relaxed():
        return "<p>relaxed</p>"

    @flask_app.get("/test/own")
    def own():
        response = make_response("app page")
        response.headers["Content-Security-Policy"] = "sandbox allow-scripts"
        return response

    @flask_app.get("/test/app")
    def app_page():
        request.environ[APP_PROXY] = True
        return "an app's own page"

    client = flask_app.test_client()
    default = client.get("/healthz").headers
    assert default["X-Frame-Options"] == "DENY" and default["X-Content-Type-Options"] == "nosniff"
    assert "style-src 'self';" in default["Content-Security-Policy"]
    assert "style-src-elem" not in default["Content-Security-Policy"]
    relaxed_policy = client.get("/test/relaxed").headers["Content-Security-Policy"]
    assert "style-src 'self';" in relaxed_policy and "style-src-elem 'self' 'unsafe-inline'" in relaxed_policy
    assert "frame-ancestors 'none'" in relaxed_policy
    assert client.get("/test/own").headers["Content-Security-Policy"] == "sandbox allow-scripts"
    proxied = client.get("/test/app").headers
    assert not {"Content-Security-Policy", "X-Frame-Options", "Referrer-Policy"} & set(proxied.keys())
