"""The redirect rule of the server-rendered pages. The pages and the host-side commands
themselves are tests/workspace/test_pages_cli.py."""

import pytest

from app.workspace.routes.pages import safe_redirect


@pytest.mark.parametrize(
    "value,expected",
    [
        ("/workspaces?x=1", "/workspaces?x=1"),
        ("", "/"),
        (None, "/"),
        ("https://evil.example", "/"),
        ("//evil.example", "/"),
        ("/\\evil.example", "/"),
        ("/ok\r\nSet-Cookie: x", "/"),
        ("evil", "/"),
        ("javascript:alert(1)", "/"),
        ("/\x00", "/"),
    ],
)
def test_safe_redirect(value, expected):
    assert safe_redirect(value) == expected
