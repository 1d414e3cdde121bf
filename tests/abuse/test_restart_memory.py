"""Restart memory is bounded: a `sluice broker` killed with SIGKILL restarts without copying segments into
memory. The restarted broker's peak resident set (VmHWM in /proc/<pid>/status) stays under 256 MiB, whether
the store is small in a 1 GiB segment or larger than the bound and recovered without a checkpoint."""
from __future__ import annotations

from pathlib import Path

import pytest
from servers import running_cluster

from sluice import Message, Producer, PullConsumer, PullStatus

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]
BOUND = 256 * 1024 * 1024
TOPIC = "RestartMem"


def peak_rss(pid: int) -> int:
    """VmHWM (the peak resident set) of a live process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def _count(ns: str, mq) -> int:
    n, offset = 0, 0
    with PullConsumer("RestartMemC", namesrv=ns) as consumer:
        for _ in range(100_000):
            r = consumer.pull(mq, None, offset, 256)
            if r.status != PullStatus.FOUND:
                break
            n += len(r.msg_found_list)
            offset = r.next_begin_offset
    return n


def test_small_store_in_a_1_gib_segment_restarts_in_bounded_memory(tmp_path: Path) -> None:
    # The default segment size (1 GiB) and a store of ~110 KB, as the issue found it.
    with running_cluster(tmp_path, ("broker-a",)) as c:
        with Producer("RestartMemP", namesrv=c.ns) as p:
            mq = p.send(Message(TOPIC, b"first")).queue
            for i in range(100):
                p.send(Message(TOPIC, b"%04d" % i + b"." * 1000), queue=mq)
        restarted = c.restart_broker(kill=True)
        assert _count(c.ns, mq) == 101  # recovered and serving
        peak = peak_rss(restarted.pid)
        print(f"restarted broker peak RSS {peak / 2**20:.0f} MiB")
        assert peak <= BOUND, f"restarted broker peaked at {peak / 2**20:.0f} MiB"


def test_store_larger_than_the_bound_recovers_without_checkpoint_in_bounded_memory(tmp_path: Path) -> None:
    # ~320 MB of records over 64 MiB segments; without a checkpoint recovery verifies the last three
    # segments whole (192 MiB), and dispatch replays everything: both must read through bounded windows.
    with running_cluster(tmp_path, ("broker-a",), config="commitlog_file_size = 67108864\n") as c:
        body = b"x" * 8000
        sent = 0
        with Producer("RestartMemBig", namesrv=c.ns) as p:
            p.send(Message(TOPIC, body))
            sent = 1
            while sent < 40_000:  # 40,000 x ~8 KB = 320 MB
                p.send_batch([Message(TOPIC, body) for _ in range(100)])
                sent += 100
        c.broker.kill()
        store = c.store()
        for name in ("checkpoint", "consumequeue"):  # recovery must rebuild it all from the log
            p_ = store / name
            if p_.is_file():
                p_.unlink()
        restarted = c.restart_broker()
        with PullConsumer("RestartMemBigC", namesrv=c.ns) as consumer:
            total = 0
            for q in consumer.fetch_message_queues(TOPIC):
                total += consumer.max_offset(q)
        assert total == sent
        peak = peak_rss(restarted.pid)
        print(f"restarted broker peak RSS {peak / 2**20:.0f} MiB")
        assert peak <= BOUND, f"restarted broker peaked at {peak / 2**20:.0f} MiB"
