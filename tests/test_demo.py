"""The README's main job, end to end, as a user runs it (without the Spark part, covered in tests/spark)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


@pytest.mark.integration
def test_demo_without_workdir_says_its_temporary_files_are_gone():
    # The output names the store, logs and Parquet export; without --workdir they are removed at the end, and a
    # newcomer looking for them must be told (and how to keep them).
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "demo", "--no-spark", "--messages", "200"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("Removed ") and "--workdir DIR keeps them" in last, proc.stdout
    root = last.removeprefix("Removed ").split(" (", 1)[0]
    assert "sluice-demo-" in root and not Path(root).exists()
