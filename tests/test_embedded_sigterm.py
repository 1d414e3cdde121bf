"""A program killed by SIGTERM stops the servers it started (sluice.embedded.exit_on_sigterm): they run in
sessions of their own, so without it they would outlive it, holding their ports and stores."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sluice.embedded import exit_on_sigterm

PROGRAM = textwrap.dedent("""
    import sys, time
    from sluice.embedded import SluiceProcess
    with SluiceProcess.start(["namesrv"], sys.argv[1]) as ns:
        print(ns.pid, flush=True)
        time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie (exited, not yet reaped by init) counts as gone
        return fh.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
def test_a_sigterm_program_stops_the_servers_it_started(tmp_path) -> None:
    prog = subprocess.Popen([sys.executable, "-c", PROGRAM, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        child = int(prog.stdout.readline())  # type: ignore[union-attr]
        assert _alive(child)
        prog.send_signal(signal.SIGTERM)
        assert prog.wait(30) == -signal.SIGINT  # as after Ctrl-C: KeyboardInterrupt, uncaught
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"namesrv {child} outlived the program that started it"
    finally:
        if prog.poll() is None:
            prog.kill()
            prog.wait()
        if child and _alive(child):  # the failure above: not left running
            os.kill(child, signal.SIGKILL)


def test_a_program_that_handles_sigterm_keeps_its_handler() -> None:
    def mine(signum, frame):  # type: ignore[no-untyped-def]
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        exit_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
