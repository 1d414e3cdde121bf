"""Where RocketMQ's own clients live for the tests that drive them (librocketmq in .venv-cpp, ali-ons under
tests/realclients/node_modules; scripts/bootstrap_clients.sh installs both), and the skip when they are not."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "realclients"
CPP_PYTHON = ROOT / ".venv-cpp" / "bin" / "python"

needs_real_clients = pytest.mark.skipif(
    not CPP_PYTHON.exists() or shutil.which("node") is None or not (REAL / "node_modules" / "ali-ons").exists(),
    reason="the real clients are not installed (scripts/bootstrap_clients.sh)")
