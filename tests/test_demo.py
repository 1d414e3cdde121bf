"""The README's main job, end to end, as a user runs it (without the Spark part, covered in tests/spark)."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration
def test_demo_runs_and_checks_every_consumer(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "demo", "--no-spark", "--messages", "600", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Demo passed" in proc.stdout
    for name in ("everything", "payments", "big-eu-us", "rare"):
        assert name in proc.stdout
    assert "MISMATCH" not in proc.stdout
    assert (tmp_path / "store" / "commitlog").is_dir()
