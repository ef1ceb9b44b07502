"""The shared provider transport (app/common/provider_http.py) against a real local
HTTP server: kept-alive connections, compressed and capped bodies, the deadline (head
and body, in plain threads; under gevent's patching in tests/common/test_provider_http.py),
refusals worded per service with the provider's text redacted or left out, redirects,
lines and SSE records."""

import json
import socket

import pytest

from app.common import provider_http
from app.common.provider_http import Deadline, Exchange, ProviderFailed, Wording
from tests.support.provider_http import KEY, FakeProvider


@pytest.fixture(scope="module")
def fake():
    with FakeProvider() as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(fake):
    fake.seen.clear()
    fake.release.clear()
    yield
    fake.release.set()  # a held answer ends with the test


class Refused(ProviderFailed):
    """A service's own error type."""


class Shy(Wording):
    error = Refused
    unreachable = "{name} cannot be reached ({cause})"


def exchange(fake, wording=None, seconds=5.0, pool="tests"):
    return Exchange(wording or Wording("Fake"), Deadline(seconds), fake.base, 1.0, pool=pool)


def call(fake, path, wording=None, seconds=5.0, headers=None, **options):
    with exchange(fake, wording, seconds).open("GET", fake.base + path, headers or {}, **options) as ex:
        return ex.json()


def failure(run):
    with pytest.raises(ProviderFailed) as caught:
        run()
    return caught.value


def test_json_and_compressed_json(fake):
    assert call(fake, "/json") == {"ok": True}
    assert call(fake, "/gzip") == {"zipped": True}


def test_calls_of_one_pool_share_a_kept_alive_connection(fake):
    for _ in range(3):
        with exchange(fake, pool="keep-alive").open("POST", fake.base + "/json", {}, {"n": 1}) as ex:
            assert ex.json() == {"ok": True}
    assert len({entry["port"] for entry in fake.seen}) == 1


def test_a_part_read_answer_does_not_spoil_the_pool(fake):
    with exchange(fake, pool="part-read").open("GET", fake.base + "/big", {}) as ex:
        next(ex.chunks())
    assert call(fake, "/json") == {"ok": True}


def test_size_cap_and_not_json(fake):
    with exchange(fake).open("GET", fake.base + "/big", {}) as ex:
        too_large = failure(lambda: ex.body(limit=1000))
    assert (too_large.status, too_large.message) == (502, "Fake's answer is larger than 1000 bytes")
    not_json = failure(lambda: call(fake, "/text"))
    assert (not_json.status, not_json.message) == (502, "Fake answered something that is not JSON")


def test_refusals_never_show_the_key(fake):
    rejected = failure(lambda: call(fake, "/status/401", Wording("Fake", show_text=True, api_key=KEY)))
    assert (rejected.status, rejected.message) == (502, "Fake rejected the API key (HTTP 401)")
    quiet = failure(lambda: call(fake, "/status/500"))
    assert quiet.message == "Fake answered HTTP 500"
    told = failure(lambda: call(fake, "/status/500", Wording("Fake", show_text=True, api_key=KEY)))
    assert told.message == "Fake answered HTTP 500: wrong key ***, try *** again"
    missing = failure(lambda: call(fake, "/nothing-here", Wording("Fake", show_text=True)))
    assert missing.message == "Fake answered HTTP 404: no such route"


def test_a_service_words_its_failures_and_names_its_error(fake):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    base = f"http://127.0.0.1:{port}"
    ex = Exchange(Shy("the AI provider"), Deadline(5.0), base, 1.0)
    refused = failure(lambda: ex.open("GET", base + "/json", {}))
    assert isinstance(refused, Refused)
    assert (refused.status, refused.message) == (502, "the AI provider cannot be reached (connection refused)")
    plain = failure(lambda: Exchange(Wording("Fake"), Deadline(5.0), base, 1.0).open("GET", base + "/json", {}))
    assert plain.message == f"Fake could not be reached at {base} (connection refused or reset)"


def test_a_passed_deadline_calls_nobody(fake):
    deadline = Deadline(0.0)
    ex = Exchange(Wording("Fake"), deadline, fake.base, 1.0)
    late = failure(lambda: ex.open("GET", fake.base + "/json", {}))
    assert (late.status, late.message) == (504, "Fake did not answer within 0 s")
    assert fake.seen == []


@pytest.mark.parametrize("path", ["/hold-head", "/hold-body"])
def test_the_deadline_bounds_head_and_body(fake, path):
    late = failure(lambda: call(fake, path, seconds=0.3))
    assert (late.status, late.message) == (504, "Fake did not answer within 0.3 s")


def test_lines_and_records(fake):
    with exchange(fake).open("GET", fake.base + "/lines", {}) as ex:
        assert [json.loads(line) for line in ex.lines()] == [{"a": 1}, {"b": 2}, {"c": 3}]
    with exchange(fake).open("GET", fake.base + "/sse", {}) as ex:
        assert [(r.event, r.data) for r in ex.records()] == [(None, "one"), ("x", "two\nlines")]


def test_redirects_keep_the_key_within_its_origin(fake):
    with FakeProvider() as other:
        here = fake.base[len("http://") :]
        there = other.base[len("http://") :]
        auth = {"Authorization": "Bearer " + KEY}
        assert call(fake, f"/redirect/{here}/json", headers=auth, redirects=2) == {"ok": True}
        assert call(fake, f"/redirect/{there}/json", headers=auth, redirects=2) == {"ok": True}
        assert fake.seen[1]["headers"].get("Authorization") == "Bearer " + KEY
        assert "Authorization" not in other.seen[0]["headers"]
    unfollowed = failure(lambda: call(fake, f"/redirect/{here}/json"))
    assert unfollowed.message == "Fake answered HTTP 302"


def test_a_308_keeps_the_method_and_the_body(fake):
    with exchange(fake).open("POST", fake.base + "/moved/json", {}, {"hello": 1}, redirects=1) as ex:
        assert ex.json() == {"ok": True}
    assert [(s["method"], s["path"], s["body"]) for s in fake.seen] == [
        ("POST", "/moved/json", b'{"hello": 1}'),
        ("POST", "/json", b'{"hello": 1}'),
    ]


def test_a_caller_may_take_the_environments_proxy(fake, monkeypatch):
    """The wizard's calls take HTTP(S)_PROXY as requests' Session does; the
    notebook's never do. The fake answers a proxy's absolute-form request too."""
    monkeypatch.setenv("HTTP_PROXY", fake.base)
    monkeypatch.setenv("NO_PROXY", "")
    target = "http://provider.invalid/json"  # resolves nowhere: only the proxy can answer
    with Exchange(Wording("Fake"), Deadline(5.0), target, 1.0, pool="proxied", environment=True).open(
        "GET", target, {}
    ) as ex:
        assert ex.json() == {"ok": True}
    assert fake.seen[-1]["path"] == target
    direct = failure(
        lambda: Exchange(Wording("Fake"), Deadline(5.0), target, 1.0, pool="direct").open("GET", target, {})
    )
    assert direct.status == 502


def test_redaction():
    assert provider_http.redacted(f"bad {KEY}\n\n  and token-abcdefgh", KEY) == "bad *** and ***"
    assert provider_http.error_text({"error": "api_key_1234567 is wrong"}) == "*** is wrong"
    assert provider_http.error_text(["not", "an", "object"]) == ""
