"""File descriptors grow with the active queues, not with every queue that ever existed: a broker with
``max_open_queues = 16`` takes sends to 300 auto-created topics, and its open descriptors (/proc/<pid>/fd)
stay within the bound while every cold queue still reads back right."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from servers import running_cluster

from sluice import Message, Producer, PullConsumer, PullStatus

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MAX_OPEN = 16
TOPICS = 300


def open_fds(pid: int) -> list[str]:
    out = []
    d = f"/proc/{pid}/fd"
    for name in os.listdir(d):
        try:
            out.append(os.readlink(f"{d}/{name}"))
        except FileNotFoundError:  # closed meanwhile
            pass
    return out


def test_cold_queue_files_are_closed_and_reopen(tmp_path: Path) -> None:
    config = f"max_open_queues = {MAX_OPEN}\ncommitlog_file_size = 8388608\n"
    with running_cluster(tmp_path, ("broker-a",), config=config) as c:
        pid = c.broker.pid
        with Producer("FdP", namesrv=c.ns) as p, PullConsumer("FdC", namesrv=c.ns) as consumer:
            p.send(Message("FdWarmup", b"w"))  # connections and the store's own files are open from here
            baseline = len(open_fds(pid))
            sent = {}
            for t in range(TOPICS):
                r = p.send(Message(f"FdTopic{t}", b"body-%d" % t))
                sent[f"FdTopic{t}"] = (r.queue, b"body-%d" % t)
            fds = open_fds(pid)
            # Each open consume-queue file holds two descriptors (the store's, and the duplicate Python's mmap
            # keeps); the bound is on queues, whatever was ever created.
            queue_files = [f for f in fds if "/consumequeue/" in f]
            assert len(set(queue_files)) <= MAX_OPEN and len(queue_files) <= 2 * MAX_OPEN, queue_files
            assert len(fds) <= baseline + 2 * MAX_OPEN + 8, (baseline, len(fds))
            for topic, (mq, body) in sent.items():  # every queue, cold or not, reads back right
                r = consumer.pull(mq, None, 0, 32)
                assert r.status == PullStatus.FOUND, (topic, r.status)
                assert [m.body for m in r.msg_found_list] == [body]
            assert len({f for f in open_fds(pid) if "/consumequeue/" in f}) <= MAX_OPEN
            # A queue closed long ago takes new messages after its old ones.
            mq0, body0 = sent["FdTopic0"]
            r = p.send(Message("FdTopic0", b"again"), queue=mq0)
            assert r.queue_offset == 1
            got = consumer.pull(mq0, None, 0, 32)
            assert [m.body for m in got.msg_found_list] == [body0, b"again"]
        assert c.broker.alive()
