"""Starting a peer server as a child process on loopback, and stopping it by its process id.

Each peer runs in a session of its own (``start_new_session``), so stopping it signals that process group by the
child's pid: wrapper scripts (RabbitMQ's, ActiveMQ's) and what they exec go with it, and nothing else does.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from sluice.embedded import exit_on_sigterm, free_port, port_accepts

__all__ = ["INSTALL_HINT", "PeerMissing", "PeerProcess", "free_port", "require", "rss_bytes"]

INSTALL_HINT = "run scripts/install-peers.sh"


class PeerMissing(RuntimeError):
    """A peer's server or its Python client is not installed; the message says which and how to install it."""


def require(binary: str, module: str, package: str) -> str:
    """The path of ``binary``, after checking the Python client ``module`` imports; PeerMissing otherwise."""
    path = shutil.which(binary) or (binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else None)
    if path is None:
        raise PeerMissing(f"{binary} is not installed: {INSTALL_HINT}")
    try:
        __import__(module)
    except ImportError:
        raise PeerMissing(f"the Python client {package} is not installed: {INSTALL_HINT}") from None
    return path


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants in bytes (0 when gone)."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class PeerProcess:
    """A peer server started by the bench: ``with PeerProcess.start(name, argv, port, workdir) as p: ...``."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.port = port
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, name: str, argv: Sequence[str], port: int, workdir: Path, *, env: dict[str, str] | None = None,
              timeout: float = 60.0, ready_port: int | None = None) -> PeerProcess:
        """Start ``argv`` and wait (bounded) until ``ready_port`` (default ``port``) on 127.0.0.1 accepts."""
        exit_on_sigterm()  # the peer runs in a session of its own: a SIGTERM'd bench stops it on its way out
        workdir.mkdir(parents=True, exist_ok=True)
        log_path = workdir / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        peer = cls(name, proc, port, log_path)
        deadline = time.monotonic() + timeout
        while not port_accepts("127.0.0.1", ready_port or port):
            if proc.poll() is not None or time.monotonic() > deadline:
                peer.stop()
                why = f"exited with code {proc.returncode}" if proc.returncode is not None else \
                    f"did not accept connections on port {ready_port or port} within {timeout:g} s"
                raise RuntimeError(f"{name} ({' '.join(argv)}) {why}; log {log_path}:\n{peer.log_tail()}")
            time.sleep(0.1)
        return peer

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def rss(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the peer's process group (its pid), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)  # stragglers of the group (a wrapper's children)
        if self.proc.poll() is None:
            self.proc.wait(5)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> PeerProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
