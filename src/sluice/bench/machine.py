"""The machine a result was measured on: cores, memory, Python, the disk the stores are written to."""
from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["describe_machine", "host_probe"]


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


def _python_work() -> dict[str, int]:
    """A fixed piece of interpreter work (dict, str and int operations, as per-message code does)."""
    d: dict[str, int] = {}
    for i in range(20_000):
        k = f"k{i % 512}"
        d[k] = d.get(k, 0) + len(k)
    return d


def _round_trips(n: int, idle_s: float, cpus: tuple[int, int], warmup: int = 100) -> list[float]:
    """Microseconds of ``n`` 64-byte TCP round trips over loopback between this thread and one that echoes them,
    each after ``idle_s`` of sleep (0: back to back), the two pinned to ``cpus`` (different cores: every
    message wakes a thread on the other core, as between a client and a broker). Unpinned, the scheduler
    sometimes kept the pair on one core and a round trip took a quarter of the time, so the figure said
    more about placement than about the host."""
    server = socket.create_server(("127.0.0.1", 0))
    payload = b"p" * 64

    def echo() -> None:
        os.sched_setaffinity(0, {cpus[1]})  # this thread only (Linux)
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)

    mine = os.sched_getaffinity(0)
    t = threading.Thread(target=echo, name="sluice-bench-probe", daemon=True)
    t.start()
    out: list[float] = []
    try:
        os.sched_setaffinity(0, {cpus[0]})
        with socket.create_connection(server.getsockname(), timeout=10) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(warmup + n):
                if idle_s:
                    time.sleep(idle_s)
                t0 = time.perf_counter()
                c.sendall(payload)
                got = 0
                while got < len(payload):
                    got += len(c.recv(64))
                if i >= warmup:
                    out.append((time.perf_counter() - t0) * 1e6)
    finally:
        os.sched_setaffinity(0, mine)
        server.close()
        t.join(10)
    return out


def host_probe() -> dict[str, float | None]:
    """How fast this host is right now, in about a second: a fixed piece of interpreter work (best of five,
    ms) and loopback round trips between threads on two cores, back to back and each after 1 ms idle (p50,
    µs; None with a single core). On a shared machine these move with the neighbours' load (identical runs
    here differed up to 2x within minutes), so a report states them at its start and end, and runs made at
    different times compare through them."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        _python_work()
        times.append((time.perf_counter() - t0) * 1e3)
    out: dict[str, float | None] = {"python_ms": round(min(times), 2), "loopback_rtt_us": None,
                                    "loopback_rtt_after_idle_us": None}
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        pair = (cpus[0], cpus[1])
        out["loopback_rtt_us"] = round(statistics.median(_round_trips(300, 0.0, pair)), 1)
        out["loopback_rtt_after_idle_us"] = round(statistics.median(_round_trips(300, 0.001, pair, warmup=20)), 1)
    return out
