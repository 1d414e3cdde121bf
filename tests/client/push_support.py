"""Helpers for the push-consumer tests: real `sluice namesrv` / `sluice broker` subprocesses.

A uniquely named module (sdk_support.py's ``cluster`` differs): test modules import the helpers and the
``cluster`` fixture from here.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import servers
from servers import Cluster, wait_for, wait_for_route  # noqa: F401 (re-exported to the tests)

from sluice import MessageSelector, PushConsumer
from sluice.client.consume_service import Listener

#: Shrunk delay levels for the tests: level 3 (the first retry) is 0.3 s, level 4 0.4 s, ...
FAST_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s 1s 1s 1s 1s 1s 1s 1s 1s"

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("consumer_worker.py")

_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid()}x{next(_names)}"


def start_cluster(tmp: Path, *, delay_levels: str = FAST_LEVELS, max_reconsume_times: int = 16) -> Cluster:
    """A namesrv and one broker (broker-a) with these delay levels and retry bound, and 8 queues a topic."""
    return servers.start_cluster(tmp, config=f'message_delay_level = "{delay_levels}"\n'
                                             f"max_reconsume_times = {max_reconsume_times}\n"
                                             "default_topic_queue_nums = 8\n")


def stop_cluster(c: Cluster) -> None:
    c.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One namesrv and one broker (shrunk delay levels) shared by a module; each test uses its own names."""
    c = start_cluster(tmp_path_factory.mktemp("push"))
    try:
        yield c
    finally:
        stop_cluster(c)


def start_consumer(c: Cluster, group: str, topic: str, listener: Listener,
                   selector: MessageSelector | str | None = "*", *,
                   orderly: bool = False, **options: Any) -> PushConsumer:
    """A started PushConsumer of ``group`` on ``topic`` (``options``: PushConsumer keywords)."""
    cons = PushConsumer(group, namesrv=c.ns, **options)
    cons.subscribe(topic, selector)
    cons.register_listener(listener, orderly=orderly)
    cons.start()
    return cons


@dataclass
class Worker:
    """A consumer_worker.py subprocess writing one line per consumed message to ``log``."""

    proc: subprocess.Popen[bytes]
    log: Path
    name: str

    def lines(self) -> list[list[str]]:
        try:
            text = self.log.read_text()
        except FileNotFoundError:
            return []
        return [ln.split("\t") for ln in text.splitlines() if ln.count("\t") >= 3 and not ln.startswith("#")]

    def ready(self) -> bool:
        try:
            return "#ready" in self.log.read_text()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


def start_worker(tmp: Path, name: str, namesrv: str, group: str, topic: str, *extra: str) -> Worker:
    log = tmp / f"{name}.log"
    err = open(tmp / f"{name}.stderr.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "--namesrv", namesrv, "--group", group, "--topic", topic, "--log", str(log),
         "--name", name, *extra],
        stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT / "src")})
    err.close()
    return Worker(proc, log, name)
