"""The wizard's own metrics on `/metrics`: generation calls by outcome, the provider's
latency, and the local repairs and reruns of invalid JSON output."""

from tests.support.metrics import scrape
from tests.support.wizard import text_call

CALLS = "bundle_wizard_generations_total"
LATENCY = "bundle_wizard_provider_request_duration_seconds_count"
REPAIRS = "bundle_wizard_json_repairs_total"
RERUNS = "bundle_wizard_json_reruns_total"


def test_generation_calls_latency_repairs_and_reruns(ai_server, alice):
    before = scrape(ai_server)
    # model -> its status; the fake provider's scenarios (devtools/fake_providers.py)
    for model, status in (
        ("fake-valid-json", 200),
        ("fake-repairable", 200),  # invalid, repaired locally
        ("fake-invalid-twice", 502),  # invalid, not repaired, rerun, still invalid
        ("fake-error-500", 502),
        ("fake-slow", 504),  # slower than WIZ_AI_TIMEOUT
    ):
        response = text_call(alice, model)
        assert response.status_code == status, (model, response.text)
    image = alice.post("/api/ai/image", json={"subject": "a lighthouse", "aspectRatio": "1:1"})
    assert image.status_code == 200, image.text
    after = scrape(ai_server)

    def moved(name, **labels):
        return (after.value(name, **labels) or 0) - (before.value(name, **labels) or 0)

    assert moved(CALLS, type="text", outcome="ok") == 2
    assert moved(CALLS, type="text", outcome="invalid") == 1
    assert moved(CALLS, type="text", outcome="provider_error") == 1
    assert moved(CALLS, type="text", outcome="timeout") == 1
    assert moved(CALLS, type="text", outcome="error") == 0
    assert moved(CALLS, type="image", outcome="ok") == 1
    # One request per attempt: the invalid output's rerun is a second one.
    assert moved(LATENCY, type="text") == 6
    assert moved(LATENCY, type="image") == 1
    # The timed-out attempt took over 0.5 s (WIZ_AI_TIMEOUT is 1 s); the quick answers under it.
    bucket = "bundle_wizard_provider_request_duration_seconds_bucket"
    assert 1 <= moved(bucket, type="text", le="0.5") <= 5
    assert moved(bucket, type="text", le="+Inf") - moved(bucket, type="text", le="0.5") >= 1
    assert moved(REPAIRS, result="repaired") == 1
    assert moved(REPAIRS, result="still_invalid") == 2
    assert moved(RERUNS) == 1
