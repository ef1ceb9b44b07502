"""The wizard's fixtures (tests/wizard/conftest.py), here on apps in process."""

from tests.wizard.conftest import admin, wizard, wizard_server

__all__ = ["admin", "wizard", "wizard_server"]
