"""Restart memory is bounded with a large key index to check whole: a `sluice broker` killed with SIGKILL
and restarted without a checkpoint runs the index's whole check (store/index_repair.py repair_whole) over
6 M entries of its newest index file (the default 5 M slots x 20 M entries geometry). Reading them all at
once took ~60 bytes an entry (~400 MB); in windows the restarted broker's peak resident set (VmHWM) stays
under 256 MiB."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from servers import running_cluster
from test_restart_memory import BOUND, _count, peak_rss

from sluice import Message, Producer, PullConsumer
from sluice.errors import TopicNotExistError
from sluice.store.index import IndexService

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.slow]
TOPIC = "RestartMemIndex"
ENTRIES = 6_000_000


def _fill_index(index_dir: Path, log_end: int) -> None:
    """Replace the broker's index files by one holding ENTRIES sound entries (the keys of messages at
    commit-log offsets below ``log_end``, so recovery keeps them), written as dispatch writes them."""
    for p in index_dir.iterdir():
        p.unlink()
    s = IndexService(index_dir)  # the store's default geometry, as the broker opens it
    s.load()
    rng = np.random.default_rng(7)
    per_offset = -(-ENTRIES // log_end)  # entries at one commit-log offset (one message's keys)
    step = per_offset * 800  # whole messages per call: a call's first offset is past the last one's
    for a in range(0, ENTRIES, step):
        m = min(step, ENTRIES - a)
        hashes = rng.integers(0, 1 << 31, m, dtype=np.int64)
        phys = np.arange(a, a + m, dtype=np.int64) // per_offset
        s.build_index_hashes(hashes, phys, 1_700_000_000_000 + phys)
    assert len(s.files) == 1 and s.files[0].count == ENTRIES + 1
    s.close()


def _wait_route(ns: str) -> None:
    """The restarted broker registers its topics once listening: wait (bounded) for the route."""
    with PullConsumer("RestartMemIdxW", namesrv=ns) as consumer:
        for _ in range(100):
            try:
                if consumer.fetch_message_queues(TOPIC):
                    return
            except TopicNotExistError:
                pass
            time.sleep(0.1)
    raise AssertionError(f"no route for {TOPIC} after the restart")


def test_whole_index_check_at_restart_in_bounded_memory(tmp_path: Path) -> None:
    with running_cluster(tmp_path, ("broker-a",)) as c:
        with Producer("RestartMemIdxP", namesrv=c.ns) as p:
            mq = p.send(Message(TOPIC, b"first", keys=["k0"])).queue
            for i in range(100):
                p.send(Message(TOPIC, b"%04d" % i + b"." * 1000, keys=[f"k{i + 1}"]), queue=mq)
        c.broker.kill()
        store = c.store()
        _fill_index(store / "index", 100_000)  # the bodies alone fill more than 100,000 bytes of the log
        (store / "checkpoint").unlink(missing_ok=True)  # no trusted index offset: the whole check
        restarted = c.restart_broker()
        _wait_route(c.ns)
        assert _count(c.ns, mq) == 101  # recovered and serving
        peak = peak_rss(restarted.pid)
        print(f"restarted broker peak RSS {peak / 2**20:.0f} MiB")
        assert peak <= BOUND, f"restarted broker peaked at {peak / 2**20:.0f} MiB"
        err = (c.tmp / "broker-a-restarted.stderr.log").read_text()
        assert "index" not in err or "dropped" not in err  # the sound file was checked and kept
