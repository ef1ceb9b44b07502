"""Every bench in bench/ runs to its end with its smallest settings, so that none rots
between the sessions that measure with it. This checks that a bench finishes and prints
its figures, never the figures themselves: timing is the bench's business, not a test's."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each bench with its smallest settings (`--quick` where it has one).
SMOKE_ARGUMENTS = {
    "agents": ["--quick"],
    "audio": ["--quick"],
    "backup": ["--quick"],
    "decks": ["--quick"],
    "failover": ["--quick"],
    "fanout": ["--quick"],
    "metrics": ["--quick"],
    "notebook": ["--quick", "--sources", "20", "--queries", "20"],
    "notebook_ask": ["--streams", "10", "--rounds", "1"],
    "refresh": ["--quick"],
    "scale": ["--quick"],
    "storm": ["--quick"],
    "wizard": ["--quick"],
    "workspace": ["--quick"],
    "workspace_apps": ["--quick"],
}

pytestmark = pytest.mark.slow


NOT_BENCHES = ("__init__", "common", "fanout_apps")  # what the benches import or start


def test_every_bench_has_smoke_settings():
    benches = {path.stem for path in (ROOT / "bench").glob("*.py") if path.stem not in NOT_BENCHES}
    assert benches == set(SMOKE_ARGUMENTS)


@pytest.mark.parametrize("bench", sorted(SMOKE_ARGUMENTS))
def test_the_bench_runs_to_its_end(bench, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", *SMOKE_ARGUMENTS[bench]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert run.returncode == 0, f"{bench} exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), f"{bench} printed no figures"
