"""A filter server killed under a push consumer: the broker starts a new one, the route lists it, the client
registers its class there and the consumer resumes from its committed offsets, losing nothing."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from sdk_class_support import class_cluster, filter_servers, send_numbered, wait_for, wait_for_filter_servers

from sluice import ConsumeResult, MessageSelector, PushConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def filtersrv_children(parent: int) -> list[int]:
    """The pids of ``parent``'s child processes running ``sluice filtersrv``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"filtersrv" in cmd:
            out.append(int(entry.name))
    return out


def test_killed_filter_server_is_restarted_and_consumers_resume_without_loss(tmp_path: Path):
    with class_cluster(tmp_path) as c:
        topic = "Restart"
        send_numbered(c.ns, topic, 0, 30)
        got: list[int] = []
        lock = threading.Lock()

        def listener(msgs) -> ConsumeResult:
            with lock:
                got.extend(int(m.properties["n"]) for m in msgs)
            return ConsumeResult.SUCCESS
        consumer = PushConsumer("restart_g", namesrv=c.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                persist_offset_interval=0.5, pull_time_delay_when_exception=0.3)
        consumer.subscribe(topic, MessageSelector.by_class("evens:Even"))
        consumer.register_listener(listener)
        consumer.start()
        try:
            wait_for(lambda: len(set(got)) >= 15, 60, "the first even messages")
            before = filter_servers(c.ns, topic)
            pids = wait_for(lambda: filtersrv_children(c.broker.pid), 10, "the broker's filter server process")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            # sent while no filter server runs: delivered once the new one serves
            send_numbered(c.ns, topic, 30, 30)
            wait_for(lambda: [p for p in filtersrv_children(c.broker.pid) if p not in pids], 60,
                     "a filter server restarted by the broker")
            wait_for_filter_servers(c.ns, 1, topic)
            want = {i for i in range(60) if i % 2 == 0}
            wait_for(lambda: set(got) >= want, 90, "every even message after the restart", interval=0.2)
            assert consumer.class_filter_error(topic) is None or set(got) >= want
        finally:
            consumer.shutdown()
        assert set(got) == want  # nothing lost, nothing unfiltered (duplicates allowed: at least once)
        assert before  # the route listed a filter server before the kill
