"""The test identity as a gunicorn service starts with it: ignored unless enabled, and
a warning at the start when it is.
The identity's route logic is tests/unit/wizard/test_identity.py."""

from tests.support.wizard import WizardClient


def test_test_identity_is_ignored_unless_enabled(start_service):
    service = start_service("wizard")
    response = WizardClient(service.base_url, "tess", "admins").get("/api/me")
    assert response.status_code == 401


def test_enabling_the_test_identity_warns_at_start(start_service, tmp_path):
    log_path = tmp_path / "stderr"
    with open(log_path, "w") as stderr:
        start_service("wizard", env={"WIZ_ALLOW_TEST_IDENTITY": "1"}, stderr=stderr)
    assert "WIZ_ALLOW_TEST_IDENTITY=1" in log_path.read_text()
