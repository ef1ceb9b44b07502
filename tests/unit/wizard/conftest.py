"""The wizard's fixtures (tests/wizard/conftest.py), here on apps in process."""

from tests.wizard.conftest import admin, ai_server, alice, fake_ai, wizard, wizard_server

__all__ = ["admin", "ai_server", "alice", "fake_ai", "wizard", "wizard_server"]
