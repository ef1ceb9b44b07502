"""The generation layer (app/wizard/generation.py) against a local fake OpenAI-compatible
provider (devtools/fake_providers.py), in plain threads. Under gevent's patching, as in the
gunicorn worker: tests/wizard/test_generation.py."""

import io
import json
import socket
import threading

import pytest
from PIL import Image

from app.common.config import ConfigError
from app.wizard.generation import (
    DEFAULT_IMAGE_SYSTEM,
    SIZES,
    GenerationFailed,
    GenerationUnavailable,
    Generator,
    ImageOutcome,
    TextOutcome,
)
from devtools.fake_providers import FakeProviders

KEY = "sk-test-0123456789abcdef"
SLOW = 0.4
HELLO = [{"role": "user", "content": "Say hello."}]
TIMING_KEYS = {"requestedModel", "resolvedModel", "queueMs", "attemptMs", "repairMs", "totalMs", "attempts"}


@pytest.fixture(scope="module")
def fake():
    with FakeProviders(host="127.0.0.1", keys={"openai": KEY}, slow=SLOW) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_counts(fake):
    fake.reset()


def generator(fake, **overrides):
    options = dict(
        base_url=fake.base_url(),
        api_key=KEY,
        text_model="fake-valid-json",
        image_model="fake-png",
        provider="fake-ai",
        timeout=5.0,
        concurrency=4,
    )
    options.update(overrides)
    return Generator(**options)


def failure(call):
    with pytest.raises(GenerationFailed) as caught:
        call()
    return caught.value


def last_body(fake):
    return fake.requests[-1][1]


# -- plain text ----------------------------------------------------------------------------


def test_plain_text_has_no_timing(fake):
    outcome = generator(fake, text_model="fake-text").text(HELLO)
    assert isinstance(outcome, TextOutcome)
    assert outcome.content == "Hello from the fake provider."
    assert outcome.timing is None
    assert outcome.requested_model == "host default"
    assert outcome.resolved_model == "fake-text-resolved"


def test_request_carries_system_messages_and_key(fake):
    generator(fake, text_model="fake-text").text(HELLO, system="Be brief.")
    body = last_body(fake)
    assert body["model"] == "fake-text"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}] + HELLO
    assert "stream" not in body and "response_format" not in body


def test_model_override_is_the_requested_model(fake):
    outcome = generator(fake).text(HELLO, model="fake-text")
    assert outcome.requested_model == "fake-text"
    assert fake.count("fake-text") == 1 and fake.count("fake-valid-json") == 0


def test_bad_messages_are_a_value_error(fake):
    with pytest.raises(ValueError):
        generator(fake).text([{"role": "user"}])
    with pytest.raises(ValueError):
        generator(fake).text("hello")
    assert fake.requests == []


# -- JSON mode -------------------------------------------------------------------------------


def test_valid_json_and_its_timing(fake):
    outcome = generator(fake).text(HELLO, json_mode=True)
    assert json.loads(outcome.content) == {"ok": True, "words": ["alpha", "beta", "gamma"]}
    timing = outcome.timing
    assert set(timing) == TIMING_KEYS
    assert timing["requestedModel"] == "host default"
    assert timing["resolvedModel"] == "fake-valid-json-resolved"
    assert timing["attempts"] == 1 and timing["repairMs"] == 0
    assert all(isinstance(timing[k], int) and timing[k] >= 0 for k in ("queueMs", "attemptMs", "repairMs", "totalMs"))
    assert timing["totalMs"] >= timing["queueMs"] + timing["attemptMs"] - 1
    assert last_body(fake)["response_format"] == {"type": "json_object"}


def test_json_response_format_can_be_left_out(fake):
    generator(fake, json_response_format=False).text(HELLO, json_mode=True)
    assert "response_format" not in last_body(fake)


def test_missing_model_report_resolves_to_unknown(fake):
    outcome = generator(fake).text(HELLO, json_mode=True, model="fake-no-model")
    assert outcome.timing["resolvedModel"] == "unknown"
    assert outcome.resolved_model == "unknown"
    assert outcome.timing["requestedModel"] == "fake-no-model"


def test_repairable_output_is_repaired_without_a_rerun(fake):
    outcome = generator(fake).text(HELLO, json_mode=True, model="fake-repairable")
    assert json.loads(outcome.content) == {"title": "Repairable", "items": [1, 2, 3]}
    assert outcome.timing["attempts"] == 1
    assert fake.count("fake-repairable") == 1


def test_invalid_once_is_rerun_once(fake):
    phases = []
    outcome = generator(fake).text(
        HELLO, json_mode=True, model="fake-invalid-once", on_phase=lambda name, detail: phases.append(name)
    )
    assert json.loads(outcome.content)["ok"] is True
    assert outcome.timing["attempts"] == 2
    assert fake.count("fake-invalid-once") == 2
    assert phases == ["queued", "started", "repairing", "retrying", "started", "done"]


def test_invalid_twice_is_502_with_timing_and_nothing_made_up(fake):
    exc = failure(lambda: generator(fake).text(HELLO, json_mode=True, model="fake-invalid-twice"))
    assert exc.status == 502
    assert "not valid JSON" in exc.message
    assert exc.timing["attempts"] == 2
    assert exc.timing["resolvedModel"] == "fake-invalid-twice-resolved"
    assert set(exc.timing) == TIMING_KEYS
    assert fake.count("fake-invalid-twice") == 2  # exactly one rerun


@pytest.mark.parametrize("count", [5, 6])
def test_ideas_batch_of_5_or_6_is_accepted(fake, count):
    outcome = generator(fake).text(HELLO, json_mode=True, kind="ideas", model=f"fake-ideas-{count}")
    ideas = json.loads(outcome.content)["ideas"]
    assert len(ideas) == count
    assert all(idea["title"] and idea["description"] for idea in ideas)
    assert fake.count(f"fake-ideas-{count}") == 1


@pytest.mark.parametrize("count", [4, 7])
def test_ideas_batch_of_4_or_7_is_502_after_one_rerun(fake, count):
    model = f"fake-ideas-{count}"
    exc = failure(lambda: generator(fake).text(HELLO, json_mode=True, kind="ideas", model=model))
    assert exc.status == 502 and "5 or 6 ideas" in exc.message
    assert exc.timing["attempts"] == 2
    assert fake.count(model) == 2


def test_ideas_rule_applies_only_to_kind_ideas(fake):
    outcome = generator(fake).text(HELLO, json_mode=True, kind="smoke", model="fake-ideas-7")
    assert len(json.loads(outcome.content)["ideas"]) == 7


def test_ideas_need_the_ideas_object(fake):
    exc = failure(lambda: generator(fake).text(HELLO, json_mode=True, kind="ideas"))
    assert exc.status == 502 and fake.count("fake-valid-json") == 2


# -- provider failures ---------------------------------------------------------------------------


@pytest.mark.parametrize("json_mode", [False, True])
def test_provider_error_is_502_naming_its_status(fake, json_mode):
    exc = failure(lambda: generator(fake).text(HELLO, json_mode=json_mode, model="fake-error-500"))
    assert exc.status == 502 and "HTTP 500" in exc.message
    assert (exc.timing is not None) == json_mode
    assert fake.count("fake-error-500") == 1  # a provider failure is not rerun


def test_malformed_answer_is_502(fake):
    exc = failure(lambda: generator(fake).text(HELLO, model="fake-malformed"))
    assert exc.status == 502 and "malformed" in exc.message


def test_unknown_model_is_502_with_the_providers_reason(fake):
    exc = failure(lambda: generator(fake).text(HELLO, model="no-such-model-404"))
    assert exc.status == 502 and "HTTP 404" in exc.message and "no-such-model" in exc.message


def test_wrong_key_is_502_and_never_shows_a_key(fake):
    exc = failure(lambda: generator(fake, api_key="sk-wrong-secret-9876").text(HELLO))
    assert exc.status == 502 and "rejected the API key" in exc.message and "401" in exc.message
    for text in (exc.message, str(exc)):
        assert "sk-" not in text and "9876" not in text and KEY not in text


def test_unreachable_provider_is_502():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    gen = Generator(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, text_model="m", image_model="m", timeout=2.0)
    exc = failure(lambda: gen.text(HELLO))
    assert exc.status == 502 and "cannot be reached" in exc.message


@pytest.mark.parametrize("json_mode", [False, True])
def test_time_out_is_504(fake, json_mode):
    exc = failure(lambda: generator(fake, timeout=0.15).text(HELLO, json_mode=json_mode, model="fake-slow"))
    assert exc.status == 504 and "0.15 s" in exc.message
    if json_mode:
        assert exc.timing["attempts"] == 1 and exc.timing["totalMs"] >= 140
    else:
        assert exc.timing is None


# -- the queue -----------------------------------------------------------------------------


def run_parallel(calls):
    """Runs the callables in threads; returns their results or exceptions, in order."""
    results = [None] * len(calls)

    def run(index, call):
        try:
            results[index] = call()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def test_calls_queue_behind_the_concurrency_limit(fake):
    gen = generator(fake, concurrency=1)

    def call():
        return gen.text(HELLO, json_mode=True, model="fake-slow")

    first, second = sorted(run_parallel([call, call]), key=lambda o: o.timing["queueMs"])
    assert first.timing["queueMs"] < 100
    assert second.timing["queueMs"] >= SLOW * 1000 * 0.8  # it really waited for the first
    assert second.timing["totalMs"] >= second.timing["queueMs"] + second.timing["attemptMs"] - 1


def test_waiting_in_the_queue_counts_toward_the_time_out(fake):
    gen = generator(fake, concurrency=1, timeout=SLOW * 1.5)

    def call():
        return gen.text(HELLO, json_mode=True, model="fake-slow")

    results = run_parallel([call, call])
    done = [r for r in results if isinstance(r, TextOutcome)]
    failed = [r for r in results if isinstance(r, GenerationFailed)]
    assert len(done) == 1 and len(failed) == 1
    assert failed[0].status == 504
    assert failed[0].timing["queueMs"] >= SLOW * 1000 * 0.8


def test_a_call_that_never_gets_a_slot_is_504(fake):
    gen = generator(fake, concurrency=1, timeout=SLOW / 2)
    gen._slots.acquire()  # the only slot is taken for the whole test
    try:
        exc = failure(lambda: gen.text(HELLO, json_mode=True))
    finally:
        gen._slots.release()
    assert exc.status == 504 and "slot" in exc.message
    assert exc.timing["attempts"] == 0 and exc.timing["queueMs"] >= SLOW * 1000 / 2 * 0.8
    assert fake.requests == []


# -- streaming -----------------------------------------------------------------------------


def test_stream_delivers_chunks_in_order(fake):
    chunks = []
    outcome = generator(fake, text_model="fake-text").text(HELLO, on_chunk=chunks.append)
    assert len(chunks) > 2 and "".join(chunks) == outcome.content == "Hello from the fake provider."
    assert last_body(fake)["stream"] is True
    assert outcome.resolved_model == "fake-text-resolved" and outcome.timing is None


def test_stream_in_json_mode_relays_both_attempts(fake):
    chunks = []
    outcome = generator(fake).text(HELLO, json_mode=True, model="fake-invalid-once", on_chunk=chunks.append)
    streamed = "".join(chunks)
    assert streamed.startswith("I am sorry") and streamed.endswith(outcome.content)
    assert outcome.timing["attempts"] == 2


def test_stream_relays_reasoning_apart(fake):
    chunks, thoughts = [], []
    outcome = generator(fake).text(HELLO, model="fake-reasoning", on_chunk=chunks.append, on_reasoning=thoughts.append)
    assert "".join(thoughts) == "Let me think about this. "
    assert "".join(chunks) == outcome.content


def test_stream_without_model_report_is_unknown(fake):
    outcome = generator(fake).text(HELLO, json_mode=True, model="fake-no-model", on_chunk=lambda text: None)
    assert outcome.timing["resolvedModel"] == "unknown"


def test_failing_callbacks_do_not_fail_the_call(fake):
    def broken(*args):
        raise RuntimeError("relay is gone")

    outcome = generator(fake).text(HELLO, json_mode=True, on_chunk=broken, on_phase=broken)
    assert json.loads(outcome.content)["ok"] is True


def test_stream_time_out_is_504(fake):
    exc = failure(lambda: generator(fake, timeout=0.15).text(HELLO, model="fake-slow", on_chunk=lambda text: None))
    assert exc.status == 504


# -- images --------------------------------------------------------------------------------


def opened(webp):
    with Image.open(io.BytesIO(webp)) as img:
        img.load()
        return img.format, img.size


@pytest.mark.parametrize("model", ["fake-png", "fake-webp", "fake-url-png"])
def test_image_becomes_webp(fake, model):
    outcome = generator(fake, image_model=model).image("a lighthouse at dusk", "16:9")
    assert isinstance(outcome, ImageOutcome)
    assert outcome.webp[:4] == b"RIFF" and outcome.webp[8:12] == b"WEBP"
    assert opened(outcome.webp) == ("WEBP", (64, 36))  # the fake draws 1/16 of 1024x576
    assert (outcome.provider, outcome.model) == ("fake-ai", model)


def test_image_request_shape(fake):
    generator(fake).image("a red fox", "3:4")
    path, body = fake.requests[-1]
    assert path == "/v1/images/generations"
    assert body["size"] == "768x1024" and body["n"] == 1
    assert body["response_format"] == "b64_json"
    assert body["prompt"].startswith(DEFAULT_IMAGE_SYSTEM) and body["prompt"].endswith("a red fox")


def test_image_system_and_model_override(fake):
    outcome = generator(fake).image("a red fox", "1:1", system="Watercolour only.", model="fake-webp")
    body = last_body(fake)
    assert body["prompt"].startswith("Watercolour only.") and DEFAULT_IMAGE_SYSTEM not in body["prompt"]
    assert body["size"] == "1024x1024"
    assert outcome.model == "fake-webp" and outcome.provider == "fake-ai"


def test_every_aspect_ratio_has_its_size():
    assert set(SIZES) == {"1:1", "3:4", "4:3", "9:16", "16:9"}
    for ratio, size in SIZES.items():
        across, down = (int(n) for n in ratio.split(":"))
        width, height = (int(n) for n in size.split("x"))
        assert width * down == height * across and max(width, height) == 1024


@pytest.mark.parametrize(
    "model, words",
    [("fake-no-image", "no image"), ("fake-bad-image", "could not be decoded"), ("fake-error-500", "HTTP 500")],
)
def test_image_failures_are_502(fake, model, words):
    exc = failure(lambda: generator(fake, image_model=model).image("a cat", "1:1"))
    assert exc.status == 502 and words in exc.message


def test_slow_image_is_504(fake):
    exc = failure(lambda: generator(fake, image_model="fake-slow-image", timeout=0.15).image("a cat", "1:1"))
    assert exc.status == 504


def test_bad_image_arguments_are_value_errors(fake):
    gen = generator(fake)
    with pytest.raises(ValueError):
        gen.image("a cat", "2:1")
    with pytest.raises(ValueError):
        gen.image("   ", "1:1")
    assert fake.requests == []


# -- configuration -------------------------------------------------------------------------


def test_unconfigured_roles_are_unavailable():
    gen = Generator(base_url="", api_key="", text_model="", image_model="")
    assert not gen.available_text and not gen.available_image
    with pytest.raises(GenerationUnavailable):
        gen.text(HELLO)
    with pytest.raises(GenerationUnavailable):
        gen.image("a cat", "1:1")
    only_text = Generator(base_url="http://127.0.0.1:9/v1", api_key="", text_model="t", image_model="")
    assert only_text.available_text and not only_text.available_image


def test_from_env(monkeypatch):
    for name, value in {
        "WIZ_AI_BASE_URL": "http://127.0.0.1:9/v1/",
        "WIZ_AI_API_KEY": KEY,
        "WIZ_TEXT_MODEL": "text-m",
        "WIZ_IMAGE_MODEL": "image-m",
        "WIZ_AI_PROVIDER": "local",
        "WIZ_AI_TIMEOUT": "12.5",
        "WIZ_AI_CONCURRENCY": "2",
    }.items():
        monkeypatch.setenv(name, value)
    gen = Generator.from_env()
    assert (gen.base_url, gen.text_model, gen.image_model, gen.provider, gen.timeout, gen.concurrency) == (
        "http://127.0.0.1:9/v1",
        "text-m",
        "image-m",
        "local",
        12.5,
        2,
    )
    assert gen.available_text and gen.available_image


def test_from_env_defaults(monkeypatch):
    for name in (
        "WIZ_AI_BASE_URL",
        "WIZ_AI_API_KEY",
        "WIZ_TEXT_MODEL",
        "WIZ_IMAGE_MODEL",
        "WIZ_AI_PROVIDER",
        "WIZ_AI_TIMEOUT",
        "WIZ_AI_CONCURRENCY",
    ):
        monkeypatch.delenv(name, raising=False)
    gen = Generator.from_env()
    assert (gen.provider, gen.timeout, gen.concurrency) == ("openai", 60.0, 4)
    assert not gen.available_text and not gen.available_image


@pytest.mark.parametrize(
    "name, value",
    [
        ("WIZ_AI_TIMEOUT", "soon"),
        ("WIZ_AI_TIMEOUT", "0"),
        ("WIZ_AI_CONCURRENCY", "0"),
        ("WIZ_AI_CONCURRENCY", "many"),
        ("WIZ_AI_BASE_URL", "ftp://example.org"),
        ("WIZ_AI_API_KEY", "sk-with space"),
    ],
)
def test_from_env_refuses_bad_values(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        Generator.from_env()
    assert name in str(caught.value)
    if name == "WIZ_AI_API_KEY":
        assert value not in str(caught.value)


# -- under gevent, as in the gunicorn worker ---------------------------------------------------
