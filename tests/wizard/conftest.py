"""Fixtures of the wizard tests: the service under gunicorn with the test identity
enabled, and clients that call it as a given user (tests.support.wizard)."""

import pytest

from tests.support.wizard import TEST_IDENTITY, WizardClient


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
