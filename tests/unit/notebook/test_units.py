"""Unit tests of the notebook's pure helpers (no server): file names, chunks, the
SSRF address rule, the FTS query builder, document detection."""

import ipaddress

import pytest

from app.notebook.core.index import match_expression
from app.notebook.ingest import chunking, extract, ssrf
from app.notebook.ingest.uploads import safe_name


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("..\\..\\boot.ini", "boot.ini"),
        (".bashrc", "bashrc"),
        ("", "upload"),
        ("....", "upload"),
        ("a b/c d.txt", "c_d.txt"),
        ("\u00fcber caf\u00e9.md", "uber_cafe.md"),
        ("x" * 300 + ".pdf", "x" * 116 + ".pdf"),
        ("name.with.dots.docx", "name.with.dots.docx"),
        ("evil\x00.txt", "evil_.txt"),
    ],
)
def test_safe_name(raw, expected):
    assert safe_name(raw) == expected


def test_chunks_overlap_and_cover_the_text():
    words = [f"w{i}" for i in range(2000)]
    text = " ".join(words)
    pieces = chunking.chunks(text, 500, 100)
    assert all(len(p) <= 500 for p in pieces)
    assert pieces[0].startswith("w0 ") and pieces[-1].endswith("w1999")
    for before, after in zip(pieces, pieces[1:]):
        assert after.split()[0] in before.split()  # each chunk starts inside the previous one
    assert chunking.chunks("   ", 500, 100) == [] and chunking.chunks("short", 500, 100) == ["short"]


@pytest.mark.parametrize(
    "address, forbidden",
    [
        ("127.0.0.1", True),
        ("169.254.169.254", True),
        ("10.1.2.3", True),
        ("192.168.0.1", True),
        ("172.16.0.1", True),
        ("100.64.0.1", True),
        ("0.0.0.0", True),
        ("::1", True),
        ("fe80::1", True),
        ("::ffff:127.0.0.1", True),
        ("fd00::1", True),
        ("224.0.0.1", True),
        ("8.8.8.8", False),
        ("2606:4700::1111", False),
    ],
)
def test_ssrf_address_rule(address, forbidden):
    assert ssrf._forbidden(address, ()) is forbidden


def test_ssrf_allowlist():
    allow = (ipaddress.ip_network("127.0.0.2/32"),)
    assert not ssrf._forbidden("127.0.0.2", allow)
    assert ssrf._forbidden("127.0.0.1", allow)


def test_match_expression_quotes_every_word():
    assert match_expression('coral AND "reef" NEAR(x') == '"coral" OR "AND" OR "reef" OR "NEAR" OR "x"'
    assert match_expression("!!! ***") is None


@pytest.mark.parametrize(
    "name, head, kind",
    [
        ("a.pdf", b"%PDF-1.4", "pdf"),
        ("a.DOCX", b"PK\x03\x04", "docx"),
        ("a.md", b"# x", "text"),
        ("page.htm", b"<html>", "html"),
        ("noext", b"%PDF-1.7", "pdf"),
        ("noext", b"plain words", "text"),
    ],
)
def test_detect(name, head, kind):
    assert extract.detect(name, head) == kind


@pytest.mark.parametrize(
    "name, head", [("a.png", b"\x89PNG"), ("a.exe", b"MZ"), ("a.txt", b"a\x00b"), ("noext", b"\x00\x01\x02")]
)
def test_detect_refuses(name, head):
    with pytest.raises(extract.Unsupported):
        extract.detect(name, head)


def test_a_model_stream_sends_keepalives_while_the_model_thinks():
    """The feed of a model's records answers the SSE helper's keepalive interrupt
    between two records, and the stream still ends after the last one."""
    from gevent.event import Event

    from app.common.sse import _records, format_record
    from app.notebook.routes.streams import Feed, error_record

    thought = Event()

    def records():
        yield {"type": "step"}
        thought.wait()  # the model thinks
        yield {"type": "final_answer"}

    stream = _records([], Feed(records(), error_record), None, None, 0.05, "/ask")
    assert next(stream) == b": stream open\n\n"
    assert next(stream) == format_record({"type": "step"})
    assert next(stream) == b": keepalive\n\n"
    thought.set()
    rest = [chunk for chunk in stream if chunk != b": keepalive\n\n"]
    assert rest == [format_record({"type": "final_answer"}), b": closed: complete\n\n"]


def test_every_job_status_of_an_episode_is_one_open_notebooks_podcasts_page_knows():
    from app.notebook.routes.payloads import STATUSES
    from app.notebook.routes.serializers import EPISODE_STATUSES

    # EpisodeStatus in Open Notebook's frontend/src/lib/types/podcasts.ts: any other fails the page.
    known = {"running", "processing", "completed", "failed", "error", "pending", "submitted", "unknown"}
    assert {EPISODE_STATUSES.get(status, status) for status in STATUSES} <= known
