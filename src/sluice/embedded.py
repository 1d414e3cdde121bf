"""Start and stop real Sluice server subprocesses (integration tests and ``sluice demo``).

::

    from sluice.embedded import SluiceProcess, free_port

    with SluiceProcess.start(["namesrv"], tmp_path, name="namesrv") as ns:   # adds --listen 127.0.0.1:<free>
        client = SyncNamesrvClient(ns.addr)
        ...

As a fixture::

    @pytest.fixture
    def namesrv(tmp_path):
        with SluiceProcess.start(["namesrv", "--broker-expiry", "2"], tmp_path) as proc:
            yield proc

The child runs ``python -m sluice <args> --listen 127.0.0.1:<port>``, its
stderr goes to ``<tmp_path>/<name>.stderr.log`` (printed in the error when it
fails to start), readiness is "the port accepts a TCP connection" (bounded),
and stop is SIGTERM then SIGKILL after a timeout, by pid.

Children run in sessions of their own (a Ctrl-C in the terminal reaches the
program, whose ``with`` blocks stop them), so a program killed by SIGTERM
would leave them running: starting one makes SIGTERM in the program's main
thread a KeyboardInterrupt, as Ctrl-C is, unless the program handles SIGTERM
itself (:func:`exit_on_sigterm`).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["SluiceProcess", "exit_on_sigterm", "free_port", "wait_for_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before {host}:{port} accepted connections")
        if port_accepts(host, port):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not accept connections within {timeout:g} s")


def exit_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread, as Ctrl-C does, so the ``with`` and ``finally``
    blocks of a program that started servers in sessions of their own stop them (``sluice demo``,
    ``sluice bench``, the benchmarks, a test run killed by a timeout) instead of leaving them running.
    KeyboardInterrupt, not SystemExit: programs and pytest stop on it (pytest takes a SystemExit inside a test
    for that test's failure and goes on). Nothing when SIGTERM is handled already or when called off the main
    thread (where signal handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class SluiceProcess:
    """A running ``python -m sluice`` child process listening on ``host:port``."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, stderr_path: Path) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.stderr_path = stderr_path

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(
        cls, args: Sequence[str], tmp_path: Path, *, name: str | None = None, host: str = "127.0.0.1",
        port: int | None = None, listen_flag: str | None = "--listen", ready_timeout: float = 20.0,
        env: dict[str, str] | None = None, attempts: int = 3,
    ) -> SluiceProcess:
        """Start and wait until the port accepts connections; retries on a port stolen meanwhile."""
        name = name or (args[0] if args else "sluice")
        exit_on_sigterm()
        last: Exception | None = None
        for attempt in range(attempts):
            chosen = port if port is not None else free_port(host)
            full = list(args) + ([listen_flag, f"{host}:{chosen}"] if listen_flag else [])
            stderr_path = Path(tmp_path) / (f"{name}.stderr.log" if attempt == 0 else f"{name}.{attempt}.stderr.log")
            with open(stderr_path, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "sluice", *full], stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True,
                )
            server = cls(proc, host, chosen, stderr_path)
            try:
                wait_for_port(host, chosen, ready_timeout, proc)
                return server
            except (RuntimeError, TimeoutError) as exc:
                server.stop()
                last = RuntimeError(f"{name} ({' '.join(full)}) did not start: {exc}\n--- stderr ---\n{server.stderr()}")
                if port is not None or "address already in use" not in server.stderr().lower():
                    break
        assert last is not None
        raise last

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_stderr(self, text: str, timeout: float = 10.0) -> str:
        """Wait (bounded) until ``text`` shows up in the child's stderr; returns the whole stderr."""
        deadline = time.monotonic() + timeout
        while True:
            err = self.stderr()
            if text in err:
                return err
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{text!r} not in stderr after {timeout:g} s:\n{err}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit code."""
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> SluiceProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
