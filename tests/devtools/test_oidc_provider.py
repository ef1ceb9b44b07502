"""The devtools OpenID provider's command line, in processes of its own: the digest
command and a provider served from a YAML file. The provider in process is
tests/unit/devtools/test_oidc_provider.py."""

import subprocess
import sys
import time
from pathlib import Path

import requests

from devtools.oidc_provider import (
    verify_pbkdf2_sha512,
)
from devtools.services import free_port
from tests.support.oidc_provider_config import make_config

ROOT = Path(__file__).resolve().parents[2]


def test_digest_command_reads_the_secret_from_stdin():
    result = subprocess.run(
        [sys.executable, "-m", "devtools.oidc_provider", "digest", "--rounds", "1000"],
        cwd=ROOT,
        input="rotated secret\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    digest = result.stdout.strip()
    assert verify_pbkdf2_sha512("rotated secret", digest)
    assert "rotated secret" not in result.stdout


def test_command_line_serves_a_yaml_config(tmp_path):
    import yaml

    config = tmp_path / "idp.yml"
    config.write_text(yaml.safe_dump(make_config()))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.oidc_provider", "--config", str(config), "--port", str(port)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                metadata = requests.get(f"http://127.0.0.1:{port}/.well-known/openid-configuration", timeout=2).json()
                break
            except requests.ConnectionError:
                assert process.poll() is None and time.monotonic() < deadline, "the provider did not start"
                time.sleep(0.1)
        assert metadata["issuer"] == f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
