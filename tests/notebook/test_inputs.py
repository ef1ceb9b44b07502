"""Bad inputs: a clear {detail}, the right status, and nothing changed."""

import time

import pytest
import requests

from tests.support.notebook import MAX_UPLOAD, PASSWORD


def _count_sources(nb, notebook_id):
    return int(nb.get(f"/sources?notebook_id={notebook_id}").headers["X-Total-Count"])


def _uploads(nb):
    folder = nb.data_dir / "uploads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic " + PASSWORD},
        {"Authorization": "Bearer " + PASSWORD + "x"},
        {"X-Password": "nope"},
        {"Authorization": "Bearer"},
    ],
)
def test_wrong_or_missing_password_is_401(nb, headers):
    for method, path in (
        ("GET", "/notebooks"),
        ("POST", "/search"),
        ("GET", "/api/sources"),
        ("DELETE", "/commands/command:abc"),
    ):
        response = requests.request(method, nb.url + path, headers=headers, json={}, timeout=10)
        assert response.status_code == 401, (method, path)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert set(response.json()) == {"detail"}


def test_password_headers_accepted(nb):
    assert requests.get(nb.url + "/notebooks", headers={"X-Password": PASSWORD}, timeout=10).status_code == 200
    assert (
        requests.get(nb.url + "/notebooks", headers={"Authorization": f"bearer {PASSWORD}"}, timeout=10).status_code
        == 200
    )
    for path in ("/health", "/openapi.json", "/docs", "/api/docs"):
        assert requests.get(nb.url + path, timeout=10).status_code == 200, path


def test_pagination_edges(nb, notebook_id):
    for i in range(5):
        assert (
            nb.post(
                "/sources",
                json={
                    "type": "text",
                    "notebook_id": notebook_id,
                    "title": f"page {i}",
                    "content": f"Page number {i}.",
                    "embed": False,
                    "async_processing": True,
                },
            ).status_code
            == 202
        )
    base = f"/sources?notebook_id={notebook_id}&sort_by=title&sort_order=asc"
    assert [s["title"] for s in nb.get(base + "&limit=2").json()] == ["page 0", "page 1"]
    assert [s["title"] for s in nb.get(base + "&limit=2&offset=4").json()] == ["page 4"]
    assert nb.get(base + "&offset=5").json() == []
    assert nb.get(base + "&offset=1000000").json() == []
    assert len(nb.get(base + "&limit=100").json()) == 5
    assert nb.get(base).headers["X-Total-Count"] == "5"
    for bad in (
        "limit=0",
        "limit=101",
        "limit=-1",
        "limit=abc",
        "offset=-1",
        "offset=1.5",
        "sort_by=size",
        "sort_order=up",
        "sort_by=",
    ):
        response = nb.get(f"/sources?{bad}")
        assert response.status_code == 400 and response.json()["detail"], bad
    assert nb.get("/sources?notebook_id=notebook:nosuch").status_code == 404


def test_ids_with_wrong_prefix_or_unknown_are_404(nb, notebook_id):
    key = notebook_id.split(":", 1)[1]
    for path in (
        f"/notebooks/source:{key}",
        "/notebooks/notebook:unknown",
        "/sources/notebook:abc",
        "/notes/note:zzz",
        "/commands/command:zzz",
        "/sources/source:a%2Fb",
        "/notebooks/..%2F..",
        "/sources/source:abc/download",
    ):
        response = nb.get(path)
        assert response.status_code == 404 and "detail" in response.json(), path


def test_traversal_in_file_names_stays_in_uploads(nb, notebook_id):
    before = len(_uploads(nb))
    names = [
        "../../../../tmp/evil.txt",
        "..\\..\\windows\\evil.txt",
        "/etc/passwd.txt",
        ".hidden.txt",
        "a/../../b.txt",
        "....txt",
        "\u00e9t\u00e9 r\u00e9sum\u00e9.txt",
    ]
    for name in names:
        response = nb.post(
            "/sources",
            data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
            files={"file": (name, b"Traversal attempt contents.")},
        )
        assert response.status_code == 201, (name, response.text)
    stored = _uploads(nb)
    for stored_name in stored:
        assert "/" not in stored_name and "\\" not in stored_name and not stored_name.startswith(".")
    assert len(stored) == before + len(names)  # each its own file, none overwritten
    assert "evil.txt" in stored and "ete_resume.txt" in stored
    assert not (nb.data_dir.parent / "evil.txt").exists()


def test_empty_unsupported_and_oversized_uploads_change_nothing(nb, notebook_id):
    before, files_before = _count_sources(nb, notebook_id), _uploads(nb)
    cases = [
        (("empty.pdf", b""), 400, "empty"),
        (("picture.png", b"\x89PNG\r\n\x1a\n"), 400, "unsupported"),
        (("tool.exe", b"MZ\x00\x00"), 400, "unsupported"),
        (("binary.txt", b"a\x00b"), 400, "binary"),
        (("huge.txt", b"x" * (MAX_UPLOAD + 2 * 1024 * 1024)), 413, "larger"),
    ]
    for file, status, word in cases:
        response = nb.post("/sources", data={"type": "upload", "notebook_id": notebook_id}, files={"file": file})
        assert response.status_code == status and word in response.json()["detail"], (file[0], response.text)
    no_file = nb.post("/sources", data={"type": "upload", "notebook_id": notebook_id})
    assert no_file.status_code == 400 and "file" in no_file.json()["detail"]
    assert _count_sources(nb, notebook_id) == before and _uploads(nb) == files_before


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/health",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://localhost/",
        "http://10.0.0.1/",
        "ftp://example.org/x",
        "file:///etc/passwd",
        "http://user:pw@{link}/article.html",
        "not a url",
    ],
)
def test_ssrf_attempts_are_refused_up_front(nb, notebook_id, url):
    url = url.format(port=nb.service.port, link=nb.links.base_url.split("//")[1])
    before = _count_sources(nb, notebook_id)
    response = nb.post("/sources", json={"type": "link", "notebook_id": notebook_id, "url": url})
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith("url:")
    assert _count_sources(nb, notebook_id) == before


def test_redirect_to_an_internal_address_fails_the_job(nb, notebook_id):
    added = nb.post(
        "/sources",
        json={
            "type": "link",
            "notebook_id": notebook_id,
            "async_processing": True,
            "url": nb.links.base_url + "/to-internal",
        },
    )
    assert added.status_code == 202
    command = nb.wait_command(added.json()["command_id"])
    assert command["status"] == "failed" and "non-public" in command["error_message"]


def test_bad_json_bodies(nb, notebook_id):
    cases = [
        ("/notebooks", {"name": ""}, 400),
        ("/notebooks", {"name": "   "}, 400),
        ("/notebooks", {"name": 5}, 400),
        ("/notebooks", {"name": "x", "extra": 1}, 400),
        ("/notebooks", [], 400),
        ("/sources", {"type": "video", "notebook_id": notebook_id}, 400),
        ("/sources", {"type": "text", "notebook_id": notebook_id}, 400),
        ("/sources", {"type": "link", "notebook_id": notebook_id}, 400),
        ("/sources", {"type": "text", "content": "x", "async_processing": "maybe"}, 400),
        ("/sources", {"type": "text", "content": "x", "notebook_id": "notebook:missing"}, 404),
        ("/sources", {"type": "text", "content": "x", "transformations": ["summary"]}, 404),  # no such id
        ("/sources", {"type": "upload", "file_path": "/etc/passwd", "notebook_id": notebook_id}, 400),
        ("/sources/json", {"type": "upload", "file_path": "/etc/passwd"}, 400),
        ("/sources", {"type": "upload", "notebook_id": notebook_id}, 400),
        ("/notes", {"content": " ", "notebook_id": notebook_id}, 400),
        ("/notes", {"content": "x", "notebook_id": notebook_id, "note_type": "robot"}, 400),
        ("/search", {"query": ""}, 400),
        ("/search", {"query": "x", "limit": 0}, 400),
        ("/search", {"query": "x", "limit": 1001}, 400),
        ("/search", {"query": "x", "type": "fuzzy"}, 400),
        ("/search", {"query": "x", "minimum_score": "high"}, 400),
        ("/search", {"query": "!!!"}, 400),
        ("/search", {"query": "x", "search_sources": False, "search_notes": False}, 400),
        ("/search", {"query": "x", "notebook_id": "notebook:none"}, 404),
    ]
    before = _count_sources(nb, notebook_id)
    for path, body, status in cases:
        response = nb.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        assert isinstance(response.json()["detail"], str)
    assert _count_sources(nb, notebook_id) == before
    for raw, content_type, status in (
        (b"{not json", "application/json", 400),
        (b"name=x", "text/plain", 415),
        (b"\xff\xfe", "application/json", 400),
    ):
        response = nb.post("/notebooks", data=raw, headers={"Content-Type": content_type})
        assert response.status_code == status and response.json()["detail"]
    unchanged = nb.put(f"/notebooks/{notebook_id}", json={})  # Open Notebook's UI sends {} (a cleared description)
    assert unchanged.status_code == 200 and unchanged.json()["id"] == notebook_id
    assert nb.put(f"/notebooks/{notebook_id}", json={"archived": "maybe"}).status_code == 400
    assert nb.call("PATCH", f"/notebooks/{notebook_id}", json={}).status_code == 405


def test_notebooks_may_share_a_name(nb):
    """As in Open Notebook: two notebooks of one name are two notebooks."""
    name = f"Shared name {time.monotonic_ns()}"
    first = nb.post("/notebooks", json={"name": name})
    second = nb.post("/notebooks", json={"name": name})
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    renamed = nb.put(f"/notebooks/{second.json()['id']}", json={"name": name.upper()})
    assert renamed.status_code == 200 and renamed.json()["name"] == name.upper()
    listed = [n["id"] for n in nb.get("/notebooks").json() if n["name"].casefold() == name.casefold()]
    assert sorted(listed) == sorted([first.json()["id"], second.json()["id"]])


def test_huge_json_body_is_413(nb):
    response = nb.post(
        "/notes",
        data=b'{"content": "' + b"x" * (11 * 1024 * 1024) + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413 and response.json()["detail"]


def test_a_nul_character_is_refused_on_either_database(nb, notebook_id):
    """PostgreSQL's text cannot hold one: a 400 naming the field on both backends, and
    nothing stored; an upload's name loses it."""
    notes_before = len(nb.get(f"/notes?notebook_id={notebook_id}").json())
    sources_before = _count_sources(nb, notebook_id)
    cases = [
        ("/notebooks", {"name": "nul\x00name"}, "name"),
        ("/notes", {"content": "a\x00b", "notebook_id": notebook_id}, "content"),
        ("/sources", {"type": "text", "content": "a\x00b", "notebook_id": notebook_id}, "content"),
        ("/search", {"query": "tides\x00"}, "query"),
        ("/credentials", {"name": "k\x00", "provider": "anthropic"}, "name"),
    ]
    for path, body, field in cases:
        response = nb.post(path, json=body)
        assert response.status_code == 400 and response.json()["field"] == field, (path, response.text)
    response = nb.get("/sources", params={"sort_by": "title\x00"})
    assert response.status_code == 400 and response.json()["field"] == "sort_by"
    assert len(nb.get(f"/notes?notebook_id={notebook_id}").json()) == notes_before
    assert _count_sources(nb, notebook_id) == sources_before
    upload = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
        files={"file": ("tide\x00s.txt", b"Spring tides and neap tides.", "text/plain")},
    )
    assert upload.status_code == 201, upload.text
    assert upload.json()["asset"]["file_name"] == "tides.txt"
