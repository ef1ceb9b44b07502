"""Fixtures of the wizard tests: the service under gunicorn with the test identity
enabled, and clients that call it as a given user (tests.support.wizard)."""

import pytest

from devtools.fake_providers import FakeProviders
from tests.support.wizard import AI_KEY, TEST_IDENTITY, WizardClient


@pytest.fixture(scope="module")
def wizard_server(start_module_service, db_backend):
    """One wizard per test module, on each database backend in turn."""
    return start_module_service("wizard", env={**TEST_IDENTITY, **db_backend.env()})


@pytest.fixture
def wizard(wizard_server):
    """alice, a signed-in user without groups."""
    return WizardClient(wizard_server.base_url, "alice")


@pytest.fixture
def admin(wizard_server):
    return WizardClient(wizard_server.base_url, "root", "users,admins")


@pytest.fixture(scope="module")
def fake_ai():
    """A local OpenAI-compatible provider that knows AI_KEY."""
    with FakeProviders(host="127.0.0.1", keys={"openai": AI_KEY}, slow=2.0) as fake:
        yield fake


@pytest.fixture(scope="module")
def ai_server(start_module_service, fake_ai):
    """One wizard per module whose AI generation calls `fake_ai`."""
    return start_module_service(
        "wizard",
        env={
            **TEST_IDENTITY,
            "WIZ_AI_BASE_URL": fake_ai.base_url(),
            "WIZ_AI_API_KEY": AI_KEY,
            "WIZ_TEXT_MODEL": "fake-valid-json",
            "WIZ_IMAGE_MODEL": "fake-png",
            "WIZ_AI_PROVIDER": "fake-openai",
            "WIZ_AI_TIMEOUT": "1",
        },
    )


@pytest.fixture
def alice(ai_server, fake_ai):
    """alice on `ai_server`, with the provider's record of calls emptied."""
    fake_ai.reset()
    return WizardClient(ai_server.base_url, "alice")
