"""The machine a result was measured on: cores, memory, Python, the disk the stores are written to."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["describe_machine"]


def _meminfo_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _disk(path: Path) -> dict[str, Any]:
    """Filesystem type, device, size and free space of ``path`` (from df), and whether the device is rotational
    (a nearly full disk slows every write and fsync, and makes a broker refuse sends)."""
    out: dict[str, Any] = {"path": str(path)}
    try:
        df = subprocess.run(["df", "-PT", str(path)], capture_output=True, text=True, timeout=10)
        fields = df.stdout.splitlines()[1].split()
        out.update(device=fields[0], fstype=fields[1], size_bytes=int(fields[2]) * 1024,
                   free_bytes=int(fields[4]) * 1024)
        name = Path(fields[0]).name.rstrip("0123456789")
        rot = Path(f"/sys/block/{name}/queue/rotational")
        if rot.exists():
            out["rotational"] = rot.read_text().strip() == "1"
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        pass
    return out


def describe_machine(store_dir: Path) -> dict[str, Any]:
    """The machine, with the disk under ``store_dir`` (where the run's stores go)."""
    return {
        "cores": os.cpu_count() or 0,
        "cpu": _cpu_model(),
        "memory_bytes": _meminfo_bytes(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "disk": _disk(store_dir),
    }
