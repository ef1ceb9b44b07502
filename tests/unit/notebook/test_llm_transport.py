"""The provider layer's transport in-process (plain threads, as in the job worker):
kept-alive connections, a broken answer that does not spoil the pool, the SSRF
check of a base URL, and the fake's think time that the ask benchmark uses."""

import ipaddress
import threading
import time

import pytest

from app.notebook import llm
from devtools.fake_providers import FakeProviders

HOST = "127.0.0.3"
ALLOWED = [ipaddress.ip_network(f"{HOST}/32")]
MESSAGES = [{"role": "user", "content": "How do glaciers carve valleys?"}]
DRIP_SECONDS = 3.0  # how long the fake's slow answer takes: a deadline that failed waits this long


@pytest.fixture(scope="module")
def fake():
    with FakeProviders(host=HOST, drip_seconds=DRIP_SECONDS) as server:
        yield server


def target(fake, provider="openai_compatible", timeout=1.0, allowlist=ALLOWED):
    base = fake.base_url("ollama" if provider == "ollama" else "openai")
    return llm.Target(provider, base, "", timeout, 1.0, allowlist)


def test_calls_share_kept_alive_connections(fake):
    fake.reset()
    for provider in ("openai_compatible", "ollama"):
        for _ in range(3):
            assert "glaciers" in llm.chat(target(fake, provider), "fake-chat", MESSAGES)
    ports = {}
    for entry in fake.seen:
        ports.setdefault(entry["provider"], set()).add(entry["client_port"])
    assert {provider: len(seen) for provider, seen in ports.items()} == {"openai": 1, "ollama": 1}


def test_concurrent_calls_from_threads(fake):
    fake.reset()
    results, errors = [], []

    def call():
        try:
            results.append(llm.chat(target(fake), "fake-chat", MESSAGES))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors and len(results) == 20


def test_a_broken_answer_does_not_spoil_the_pool(fake):
    started = time.monotonic()
    with pytest.raises(llm.ProviderError) as slow:
        llm.chat(target(fake, timeout=0.6), "fake-chat-slow", MESSAGES)  # drips past the deadline
    assert slow.value.status == 504 and time.monotonic() - started < DRIP_SECONDS
    with pytest.raises(llm.ProviderError) as bad:
        llm.chat(target(fake), "fake-chat-malformed", MESSAGES)
    assert bad.value.status == 502 and "not JSON" in bad.value.message
    assert "glaciers" in llm.chat(target(fake), "fake-chat", MESSAGES)
    deltas = list(llm.chat_stream(target(fake), "fake-chat", MESSAGES))
    assert "glaciers" in "".join(deltas)
    assert "glaciers" in llm.chat(target(fake), "fake-chat", MESSAGES)


def test_the_ssrf_check_still_refuses_what_it_refused(fake):
    refused = llm.Target("openai_compatible", fake.base_url("openai"), "", 1.0, 1.0, [])
    for _ in range(2):  # a refusal is never remembered as a pass
        with pytest.raises(llm.ProviderError) as exc:
            llm.chat(refused, "fake-chat", MESSAGES)
        assert exc.value.status == 400 and "NOTEBOOK_MODEL_HOST_ALLOWLIST" in exc.value.message
    assert "glaciers" in llm.chat(target(fake), "fake-chat", MESSAGES)  # the same URL, allowed
    with pytest.raises(llm.ProviderError):
        llm.chat(refused, "fake-chat", MESSAGES)  # and refused again without the allow-list


def test_the_fake_thinks_until_the_moment_asked(fake):
    fake.reset()
    moment = time.time() + 0.4
    question = [{"role": "user", "content": f"How do glaciers carve valleys? [fake: answer at {moment:.6f}]"}]
    reply = llm.chat(target(fake), "fake-chat", question)
    assert "fake: answer" not in reply
    (entry,) = fake.seen
    assert entry["first_byte"] >= moment  # never before the moment, however soon the request arrived
    started = time.monotonic()
    llm.chat(target(fake), "fake-think-300", MESSAGES)
    assert time.monotonic() - started >= 0.3
