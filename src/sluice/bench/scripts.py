"""Running the scripts in benchmarks/ (each alone, ``--quick`` when asked) and collecting their last-line JSON."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS_DIR", "discover", "run_script", "run_scripts"]

#: benchmarks/ of the source checkout this package runs from (src/sluice/bench -> the repository root).
BENCHMARKS_DIR = Path(__file__).resolve().parents[3] / "benchmarks"


def discover(directory: Path = BENCHMARKS_DIR) -> list[Path]:
    """The runnable scripts (helpers start with an underscore)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))


def run_script(path: Path, quick: bool, timeout: float, log_dir: Path) -> dict[str, Any]:
    """The script's last-line JSON object, with its wall time; an ``error`` entry when it failed."""
    argv = [sys.executable, str(path), *(["--quick"] if quick else [])]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{path.stem}.log"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=path.parent.parent,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        log.write_text(f"{exc.stdout or ''}\n--- stderr ---\n{exc.stderr or ''}")
        return {"error": f"timed out after {timeout:g} s (log {log})", "seconds": round(timeout, 1)}
    seconds = round(time.perf_counter() - t0, 1)
    log.write_text(f"{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode} (log {log})", "seconds": seconds}
    try:
        result = json.loads(lines[-1])
    except ValueError:
        return {"error": f"the last line is not JSON (log {log})", "seconds": seconds}
    if not isinstance(result, dict):
        return {"error": f"the last line is JSON but not an object (log {log})", "seconds": seconds}
    return {"result": result, "seconds": seconds}


def run_scripts(quick: bool, log_dir: Path, step: Callable[[str], None] = lambda s: None,
                directory: Path = BENCHMARKS_DIR, timeout: float | None = None) -> dict[str, Any]:
    scripts = discover(directory)
    if not scripts:
        return {"skipped": f"no benchmark scripts in {directory} (run from a source checkout)"}
    out: dict[str, Any] = {}
    for path in scripts:
        step(f"benchmarks/{path.name}{' --quick' if quick else ''}")
        out[path.stem] = run_script(path, quick, timeout or (900.0 if quick else 3600.0), log_dir)
    return out
