"""Out of descriptors at accept (EMFILE): the broker keeps running, logs one rate-limited line instead of a
traceback per retry, and serves a normal client again once descriptors are free."""
from __future__ import annotations

import os
import re
import resource
import socket
import time
from collections import Counter
from pathlib import Path

import pytest
from servers import running_cluster

from sluice import Message, Producer, PullConsumer, PullStatus

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_emfile_on_accept_is_survived(tmp_path: Path) -> None:
    with running_cluster(tmp_path, ("broker-a",)) as c:
        with Producer("EmfileP", namesrv=c.ns) as p:
            mq = p.send(Message("Emfile", b"before")).queue
        pid = c.broker.pid
        try:
            soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        except (PermissionError, OSError) as e:
            pytest.skip(f"cannot change the broker's descriptor limit: {e}")
        flood: list[socket.socket] = []
        try:
            in_use = len(os.listdir(f"/proc/{pid}/fd"))
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 2, hard))
            for _ in range(20):  # queued by the kernel; the broker's accepts run out of descriptors
                s = socket.create_connection((c.broker.host, c.broker.port), timeout=5)
                flood.append(s)
            line = c.broker.wait_for_stderr("not accepting for 1 s", timeout=15)
            assert "Too many open files" in line
            time.sleep(2.5)  # a few retries, all still failing
            assert c.broker.alive()
            err = c.broker.stderr()
            # Rate-limited, not one line per retry. Other parts that open files meanwhile (the commit-log
            # warmer, store maintenance) may log the same errno once each, so count per logger.
            per_logger = Counter(m.group(1) for m in re.finditer(r"^\S+ \S+ \w+ ([\w.]+): .*Too many open files",
                                                                  err, re.M))
            assert per_logger and max(per_logger.values()) <= 2, err
            assert "Traceback" not in err and "socket.accept() out of system resource" not in err
        finally:
            for s in flood:
                s.close()
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        # Descriptors free again: a normal client is served (after asyncio's one-second pause).
        with Producer("EmfileP2", namesrv=c.ns) as p, PullConsumer("EmfileC", namesrv=c.ns) as consumer:
            p.send(Message("Emfile", b"after"), queue=mq)
            r = consumer.pull(mq, None, 0, 32)
            assert r.status == PullStatus.FOUND
            assert [m.body for m in r.msg_found_list] == [b"before", b"after"]
        assert c.broker.alive()
