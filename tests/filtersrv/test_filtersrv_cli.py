"""`sluice filtersrv`: bad flags are usage errors (status 2) naming the flag; a taken port fails the start."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", "filtersrv", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, says", [
    (["--broker", "127.0.0.1:1", "--repository", "/no/such/dir"], "is not a directory"),
    (["--broker", "127.0.0.1:1", "--worker-cpu-seconds", "0"], "must be positive"),
    (["--broker", "127.0.0.1:1", "--repository-url", "ftp://x"], "is not http:// or https://"),
    (["--listen", "127.0.0.1:0"], "Missing option '--broker'"),
])
def test_bad_flags_are_usage_errors(args: list[str], says: str) -> None:
    out = _run(*args)
    assert out.returncode == 2 and says in out.stderr, out.stderr


def test_a_taken_port_fails_the_start(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        out = _run("--broker", "127.0.0.1:1", "--listen", f"127.0.0.1:{s.getsockname()[1]}")
    assert out.returncode == 1 and "filter server failed" in out.stderr and "address already in use" in \
        out.stderr.lower(), out.stderr
