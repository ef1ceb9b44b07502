"""Property-based tests of the whole API from its own /openapi.json (schemathesis):
no input makes a 500, and every response matches the documented status codes,
content types and schemas. Bounded: a few examples per operation (< 60 s).

(schemathesis' lazy pytest fixture does not work with this pytest, so each
operation's hypothesis strategy is driven here directly.)"""

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.notebook import AUTH, restored

EXAMPLES_PER_OPERATION = 12
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _exercise(operation, base_url):
    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case):
        case.call_and_validate(base_url=base_url, headers=AUTH, timeout=60, checks=CHECKS)

    run()


def test_api_conforms_to_its_schema(nb):
    schema = schemathesis.openapi.from_url(nb.url + "/openapi.json")
    failures, exercised = [], 0
    # The stack is shared: what schemathesis may set on it at random (the settings, say an
    # embedding default; the default models; the default prompt) is set back after.
    with restored(nb, "/settings", "/models/defaults", "/transformations/default-prompt"):
        for result in schema.get_all_operations():
            operation = result.ok()
            exercised += 1
            try:
                _exercise(operation, nb.url)
            except Exception as exc:  # every operation is run; all failures are reported together
                failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert exercised >= 20
    assert not failures, "\n\n".join(failures)
