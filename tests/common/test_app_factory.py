"""create_app's contract as gunicorn starts it: an unknown service or a bad setting
stops the start with one line. The factory in process is
tests/unit/common/test_app_factory.py."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_gunicorn(env):
    """Start a service as production does, expecting it to refuse to start."""
    return subprocess.run(
        [str(ROOT / ".venv/bin/gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env={"PORT": "0", "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("value", ["", "bogus"])
def test_unknown_service_exits_with_one_line_naming_valid_values(value):
    result = start_gunicorn({"SERVICE": value})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "workspace decks notebook audio wizard" in lines[0]


def test_a_bad_setting_stops_the_start_with_a_message_naming_it(tmp_path):
    result = start_gunicorn({"SERVICE": "audio", "DATA_DIR": str(tmp_path), "AUDIO_PROBE_INTERVAL": "soon"})
    assert result.returncode != 0
    assert "error: AUDIO_PROBE_INTERVAL must be a number of seconds, got 'soon'" in result.stderr


def test_half_an_oidc_configuration_stops_the_start(tmp_path):
    result = start_gunicorn(
        {"SERVICE": "workspace", "DATA_DIR": str(tmp_path), "WORKSPACE_OIDC_ISSUER_URL": "https://auth.example"}
    )
    assert result.returncode != 0
    assert (
        "OIDC is half configured: WORKSPACE_OIDC_CLIENT_ID, WORKSPACE_OIDC_CLIENT_SECRET must be set too"
        in result.stderr
    )
