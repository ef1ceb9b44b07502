"""Issue #32's notebook findings: extraction caps (a small DOCX once became 105 million
characters), one write limit on every route that stores text, and the SSRF guard's
IPv6 forms of internal IPv4 addresses. Each bad input: 413 (or 400) in {detail}, and
nothing stored."""

import http.server
import ipaddress
import threading
import tracemalloc

import pytest

from app.notebook import llm
from app.notebook.ingest import extract, ssrf
from tests.support import documents
from tests.support.notebook import MAX_CHARS, MAX_TEXT


def _count_sources(nb, notebook_id):
    return int(nb.get(f"/sources?notebook_id={notebook_id}").headers["X-Total-Count"])


def _uploads(nb):
    folder = nb.data_dir / "uploads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --------------------------------------------------------------------------- SSRF: IPv4 inside IPv6


@pytest.mark.parametrize(
    "host",
    [
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::a00:1",
        "64:ff9b::6440:1",
        "64:ff9b::",  # NAT64
        "64:ff9b:1::a00:1",
        "64:ff9b:1:0:8:808:800:0",  # NAT64 local-use: refused whatever it carries
        "2002:7f00:1::",
        "2002:a9fe:a9fe::1",
        "2002:c0a8:101::",
        "2002:6440:1::",  # 6to4
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:a00:1",  # IPv4-mapped
        "::127.0.0.1",
        "::a9fe:a9fe",
        "::c0a8:101",
        "::e000:1",  # IPv4-compatible
        # Teredo: the client is the last 32 bits inverted (7f.0.0.1, a9.fe.a9.fe, c0.a8.1.1, 0.0.0.0)
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
        "2001:0:4136:e378:8000:63bf:5601:5601",
        "2001:0:4136:e378:8000:63bf:3f57:fefe",
        "2001:0:4136:e378:8000:63bf:ffff:ffff",
        "2001:0:a00:1:8000:63bf:f7f7:f7f7",  # a Teredo server inside 10/8
    ],
)
def test_ipv6_forms_of_internal_addresses_are_refused(host):
    with pytest.raises(ssrf.LinkRefused, match="non-public"):
        ssrf.check_url(f"http://[{host}]/", ())


@pytest.mark.parametrize(
    "host",
    [
        "64:ff9b::808:808",  # NAT64 to 8.8.8.8: how a v6-only host reaches a v4 site
        "2002:808:808::1",
        "::ffff:8.8.8.8",
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
        "2606:4700::1111",
    ],
)
def test_ipv6_forms_of_public_addresses_are_allowed(host):
    ssrf.check_url(f"http://[{host}]/", ())


def test_allowlist_names_the_embedded_address():
    ssrf.check_url("http://[64:ff9b::a00:5]/", (ipaddress.ip_network("10.0.0.0/8"),))


# --------------------------------------------------------------------------- extraction caps (no server)


def test_docx_bomb_is_refused_from_its_zip_directory_without_inflating():
    bomb = documents.docx_bomb(64 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(extract.TooMuchText, match="inflates to"):
            extract.extract("docx", bomb, max_chars=5_000_000, ratio=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak  # 64 MB were never inflated


def test_pdf_text_is_capped_by_characters_and_by_ratio():
    ratio_bomb = documents.pdf_bytes("A" * 300_000, compress=True)  # ~1 KB yielding 300,000 characters
    with pytest.raises(extract.TooMuchText, match="per byte"):
        extract.extract("pdf", ratio_bomb, max_chars=5_000_000, ratio=100)
    with pytest.raises(extract.TooMuchText, match="more than 1000 characters"):
        extract.extract("pdf", documents.pdf_bytes("B" * 2000), max_chars=1000, ratio=100)
    text, _ = extract.extract("pdf", documents.pdf_bytes(documents.PDF_TEXT, compress=True), max_chars=1000, ratio=100)
    assert text == documents.PDF_TEXT


def test_ordinary_documents_are_within_the_caps():
    docx = documents.docx_bytes(["Quantum entanglement links particles."] * 200)
    assert extract.extract("docx", docx, max_chars=5_000_000, ratio=100)[0].count("Quantum") == 200
    assert extract.extract("text", b"x" * 5000, max_chars=5000, ratio=2)[0] == "x" * 5000
    with pytest.raises(extract.TooMuchText):
        extract.extract("text", b"x" * 5001, max_chars=5000, ratio=2)


# --------------------------------------------------------------------------- extraction caps (the service)


def test_docx_bomb_upload_is_413_and_stores_nothing(nb, notebook_id):
    before, files_before = _count_sources(nb, notebook_id), _uploads(nb)
    bomb = documents.docx_bomb(20 * 1024 * 1024)
    response = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
        files={"file": ("bomb.docx", bomb)},
    )
    assert response.status_code == 413, response.text
    assert "inflates to" in response.json()["detail"]
    assert _count_sources(nb, notebook_id) == before and _uploads(nb) == files_before


def test_over_cap_upload_in_the_background_fails_and_says_why(nb, notebook_id):
    text = b"Estuaries mix fresh and salt water. " * (MAX_CHARS // 36 + 10)  # under the upload cap
    added = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false", "async_processing": "true"},
        files={"file": ("long.txt", text)},
    )
    assert added.status_code == 202, added.text
    command = nb.wait_command(added.json()["command_id"])
    assert command["status"] == "failed" and command["result"] == {"status": 413}
    assert f"more than {MAX_CHARS} characters" in command["error_message"]
    status = nb.get(f"/sources/{added.json()['id']}/status").json()
    assert status["status"] == "failed" and f"more than {MAX_CHARS}" in status["error_message"]
    source = nb.get(f"/sources/{added.json()['id']}").json()
    assert not source["full_text"]
    sync = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
        files={"file": ("long.txt", text)},
    )
    assert sync.status_code == 413 and "characters" in sync.json()["detail"]


def test_compressed_pdf_over_the_ratio_is_413(nb, notebook_id):
    before = _count_sources(nb, notebook_id)
    response = nb.post(
        "/sources",
        data={"type": "upload", "notebook_id": notebook_id, "embed": "false"},
        files={"file": ("dense.pdf", documents.pdf_bytes("A" * 300_000, compress=True))},
    )
    assert response.status_code == 413 and "per byte" in response.json()["detail"], response.text
    assert _count_sources(nb, notebook_id) == before


# --------------------------------------------------------------------------- one write limit


@pytest.fixture
def existing(nb, notebook_id):
    source = nb.post(
        "/sources",
        json={
            "type": "text",
            "notebook_id": notebook_id,
            "title": "A tidal flat",
            "content": "Mud flats are exposed at low tide.",
            "embed": False,
        },
    )
    note = nb.post("/notes", json={"title": "Tides", "content": "Two a day.", "notebook_id": notebook_id})
    assert source.status_code == 201 and note.status_code == 201
    return source.json()["id"], note.json()["id"]


def _sends(notebook_id, source_id, note_id, content):
    """Every way of sending `content` to be stored: (method, path, requests' keywords)."""
    text = {"type": "text", "notebook_id": notebook_id, "content": content, "embed": "false"}
    return [
        ("POST", "/sources", {"json": {**text, "embed": False}}),
        ("POST", "/sources/json", {"json": {**text, "embed": False}}),
        ("POST", "/api/sources/json", {"json": {**text, "embed": False}}),
        ("POST", "/sources", {"data": text}),  # urlencoded form
        ("POST", "/sources/json", {"data": text}),
        ("POST", "/sources", {"files": {k: (None, v) for k, v in text.items()}}),  # multipart, no file
        ("POST", "/sources/json", {"files": {k: (None, v) for k, v in text.items()}}),
        ("PUT", f"/sources/{source_id}", {"json": {"title": content}}),
        ("POST", "/notes", {"json": {"content": content, "notebook_id": notebook_id}}),
        ("PUT", f"/notes/{note_id}", {"json": {"content": content}}),
    ]


def _nothing_changed(nb, notebook_id, before, source_id, note_id):
    assert _count_sources(nb, notebook_id) == before[0]
    assert len(nb.get(f"/notes?notebook_id={notebook_id}").json()) == before[1]
    assert nb.get(f"/sources/{source_id}").json()["title"] == "A tidal flat"
    assert nb.get(f"/notes/{note_id}").json()["content"] == "Two a day."


def test_a_body_over_the_text_cap_is_413_on_every_route(nb, notebook_id, existing):
    source_id, note_id = existing
    before = (_count_sources(nb, notebook_id), len(nb.get(f"/notes?notebook_id={notebook_id}").json()))
    for method, path, kwargs in _sends(notebook_id, source_id, note_id, "w" * (MAX_TEXT + 1)):
        response = nb.call(method, path, **kwargs)
        assert response.status_code == 413, (method, path, list(kwargs), response.text[:300])
        assert set(response.json()) <= {"detail", "field"}
        assert "larger than" in response.json()["detail"], (method, path, response.text)
    _nothing_changed(nb, notebook_id, before, source_id, note_id)


def test_a_text_source_sent_as_an_urlencoded_form_within_the_caps_is_added(nb, notebook_id):
    text = "Salt marshes trap sediment. " * 1000
    for path in ("/sources", "/sources/json"):
        response = nb.post(path, data={"type": "text", "notebook_id": notebook_id, "content": text, "embed": "false"})
        assert response.status_code == 201, response.text[:300]
        assert response.json()["full_text"] == text.strip()


def test_text_over_the_character_cap_is_413_on_every_route(nb, notebook_id, existing):
    source_id, note_id = existing
    before = (_count_sources(nb, notebook_id), len(nb.get(f"/notes?notebook_id={notebook_id}").json()))
    content = "w" * (MAX_CHARS + 1)  # within the byte cap (MAX_TEXT bytes)
    for method, path, kwargs in _sends(notebook_id, source_id, note_id, content):
        if method == "PUT" and path.startswith("/sources/"):
            continue  # a source's title has its own limit (500 characters: 400)
        response = nb.call(method, path, **kwargs)
        assert response.status_code == 413, (method, path, list(kwargs), response.text[:300])
        assert f"limit of {MAX_CHARS}" in response.json()["detail"]
    _nothing_changed(nb, notebook_id, before, source_id, note_id)


def test_deeply_nested_json_in_a_form_field_is_400(nb, notebook_id):
    before = _count_sources(nb, notebook_id)
    response = nb.post(
        "/sources",
        files={"type": (None, "text"), "content": (None, "Deep."), "notebooks": (None, "[" * 100_000 + "]" * 100_000)},
    )
    assert response.status_code == 400 and response.json()["detail"], response.text[:300]
    assert _count_sources(nb, notebook_id) == before


# --------------------------------------------------------------------------- deep JSON from a provider

DEEP = "[" * 100_000 + "]" * 100_000  # past the parser's recursion limit


class _DeepProvider(http.server.BaseHTTPRequestHandler):
    """Answers every chat stream (OpenAI's SSE, Anthropic's SSE, Ollama's lines) with
    one record nested too deep to parse."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/api/chat"):
            body, content_type = (DEEP + "\n").encode(), "application/x-ndjson"
        else:
            body, content_type = f"event: content_block_delta\ndata: {DEEP}\n\n".encode(), "text/event-stream"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def deep_provider():
    server = http.server.ThreadingHTTPServer(("127.0.0.3", 0), _DeepProvider)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.3:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("provider", ["openai_compatible", "anthropic", "ollama"])
def test_a_provider_stream_nested_too_deep_is_a_malformed_answer(deep_provider, provider):
    target = llm.Target(
        provider,
        deep_provider + ("/v1" if provider == "openai_compatible" else ""),
        "k",
        5.0,
        1.0,
        [ipaddress.ip_network("127.0.0.3/32")],
    )
    with pytest.raises(llm.ProviderError, match="malformed"):
        list(llm.chat_stream(target, "deep-model", [{"role": "user", "content": "Hello?"}]))


def test_a_reply_nested_too_deep_holds_no_json_object():
    assert llm.first_json_object("Here: {" + '"a": ' + DEEP + "}") is None
