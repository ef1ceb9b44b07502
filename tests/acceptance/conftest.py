"""Acceptance checks run against a deployed bundle: the dev stack of `make run`,
the staging box, or any staging host, through its public addresses.

    pytest tests/acceptance --decks-url https://decks.staging.example --insecure
    pytest tests/acceptance --decks-url http://127.0.0.1:8080 --decks-host decks.localhost

Without a URL for a service, the checks stand up their own target first: the
service under gunicorn with the sample deck, behind a real nginx.
"""

import pytest

from tests.support.acceptance import target_for


@pytest.fixture(scope="session")
def decks(request, tmp_path_factory):
    yield from target_for(request, tmp_path_factory, "decks")


@pytest.fixture(scope="session")
def audio(request, tmp_path_factory):
    yield from target_for(request, tmp_path_factory, "audio")


@pytest.fixture(scope="session")
def workspace(request, tmp_path_factory):
    yield from target_for(request, tmp_path_factory, "workspace")


@pytest.fixture(scope="session")
def wizard(request, tmp_path_factory):
    yield from target_for(request, tmp_path_factory, "wizard")


@pytest.fixture(scope="session")
def notebook(request, tmp_path_factory):
    yield from target_for(request, tmp_path_factory, "notebook")
