"""Crash tests: a child appends with synchronous flush; SIGKILL at random moments; everything acked survives."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from store_testlib import simulate_crash, small_config, verify_recovered
from crash_writer import CONFIG
from sluice.store import MessageStore

WRITER = Path(__file__).with_name("crash_writer.py")
KILLS = 18


def run_and_kill(root: Path, seed: int, rnd: random.Random) -> tuple[list[list[str]], bool]:
    proc = subprocess.Popen([sys.executable, str(WRITER), str(root), str(seed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    lines: list[bytes] = []
    ready = threading.Event()

    def drain() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line == b"ready\n":
                ready.set()
            else:
                lines.append(line)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        if rnd.random() < 0.2:
            time.sleep(rnd.uniform(0.0, 0.5))  # sometimes while it starts up and recovers
        else:
            assert ready.wait(20), proc.stderr.read().decode() if proc.poll() is not None else "no ready"
            time.sleep(rnd.uniform(0.02, 0.4))
        assert proc.poll() is None, proc.stderr.read().decode()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        t.join(10)
        proc.stderr.close()  # type: ignore[union-attr]
    # A line without its newline was cut by the kill: not acknowledged as far as the parent knows.
    return [ln.decode().split() for ln in lines if ln.endswith(b"\n")], ready.is_set()


@pytest.mark.crash
@pytest.mark.slow
def test_sigkill_while_appending(tmp_path: Path) -> None:
    root = tmp_path / "store"
    rnd = random.Random(20240601)
    acked: list[list[str]] = []
    stats: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 120
    for round_ in range(KILLS):
        assert time.monotonic() < deadline, "crash test ran out of time"
        new, was_ready = run_and_kill(root, round_, rnd)
        acked += new
        s = MessageStore(root, small_config(**CONFIG)).start()
        try:
            if was_ready:  # the child had opened the store: its abort file marks the kill
                assert s.recovery_report.abnormal
            verify_recovered(s, acked)
            stats.append((len(new), s.recovery_report.cut_bytes, sum(s.recovery_report.queues_truncated.values())))
        finally:
            # Half the time leave the store unclean again, so the next child recovers a crashed store itself.
            simulate_crash(s) if round_ % 2 else s.close()
    print("acked per round, bytes cut, units dropped:", stats)
    assert len(acked) > 50
