"""The workspace platform's fixtures (tests/workspace/conftest.py), here on apps in process."""

from tests.workspace.conftest import owned

__all__ = ["owned"]
