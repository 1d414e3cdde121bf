"""A full disk, against real `sluice broker` subprocesses: sends are refused as RocketMQ refuses them
(SERVICE_NOT_AVAILABLE, "service not available now, maybe disk full" with the figures), the broker stays up,
and a normal client still pulls and commits meanwhile; the store restarts on the full filesystem."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from servers import running_cluster
from smallfs import small_tmpfs

from sluice import Message, Producer, PullConsumer, PullStatus
from sluice.errors import SluiceError
from sluice.protocol.codes import ResponseCode

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOPIC = "DiskFull"


def _pull_all(consumer: PullConsumer, mq, limit: int = 100_000) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    for _ in range(limit):
        r = consumer.pull(mq, None, offset, 32)
        if r.status != PullStatus.FOUND:
            break
        out += [m.body for m in r.msg_found_list]
        offset = r.next_begin_offset
    return out


def _write_config(tmp: Path, text: str) -> None:
    (tmp / "broker-a.toml").write_text(text)


def test_used_space_ratio_refuses_sends_and_reads_go_on(tmp_path: Path) -> None:
    with running_cluster(tmp_path, ("broker-a",), config="commitlog_file_size = 8388608\n") as c:
        with Producer("DiskP", namesrv=c.ns) as p:
            first = p.send(Message(TOPIC, b"first"))
            mq = first.queue
            for i in range(4):
                p.send(Message(TOPIC, b"m%d" % i), queue=mq)
        # The same store, restarted with a ratio this disk is above (a used disk is over 1 %).
        _write_config(tmp_path, "commitlog_file_size = 8388608\ndisk_max_used_space_ratio = 1\n")
        c.restart_broker()
        with Producer("DiskP2", namesrv=c.ns) as p, PullConsumer("DiskC", namesrv=c.ns) as consumer:
            with pytest.raises(SluiceError) as e:
                p.send(Message(TOPIC, b"refused"), queue=mq)
            assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
            remark = str(e.value)
            assert "service not available now, maybe disk full" in remark
            assert "diskMaxUsedSpaceRatio 1%" in remark and "% used" in remark and "bytes free" in remark
            # A normal client meanwhile: reads, commits and reads its commit back.
            got = _pull_all(consumer, mq)
            assert got == [b"first", b"m0", b"m1", b"m2", b"m3"]
            consumer.update_consumer_offset(mq, 5)
            consumer.commit()
            assert consumer.fetch_consume_offset(mq) == 5
        assert c.broker.alive()


def test_tmpfs_full_broker_refuses_sends_stays_up_and_restarts(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "64m") as fs:
        conf = ("commitlog_file_size = 8388608\ndisk_max_used_space_ratio = 100\ndisk_min_free_bytes = 0\n"
                "max_message_size = 131072\n")
        _write_config(tmp_path, conf)
        with running_cluster(tmp_path, ("broker-a",)) as c:
            # The store goes on the small filesystem: restart the broker on it (same port and name).
            c.argv[0][c.argv[0].index("--store") + 1] = str(fs / "store")
            c.argv[0] += ["--config", str(tmp_path / "broker-a.toml")]
            c.restart_broker()
            acked: list[bytes] = []
            refusal = None
            with Producer("FullP", namesrv=c.ns, compress_over=1 << 30) as p:
                mq = p.send(Message(TOPIC, b"first")).queue
                acked.append(b"first")
                for i in range(2000):  # 120 MB: far more than the filesystem holds
                    body = b"%06d" % i + os.urandom(60 * 1024)
                    try:
                        p.send(Message(TOPIC, body), queue=mq)
                    except SluiceError as e:
                        refusal = e
                        break
                    acked.append(body)
            assert refusal is not None, "the 64 MiB filesystem never filled"
            assert refusal.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert "maybe disk full" in str(refusal) and "No space left on device" in str(refusal)
            assert c.broker.alive(), c.broker.stderr()
            with PullConsumer("FullC", namesrv=c.ns) as consumer:
                assert _pull_all(consumer, mq) == acked  # every acknowledged message, in order
            err = c.broker.stderr()
            assert "Traceback" not in err, err  # refusals and ENOSPC are log lines, not tracebacks
            assert err.count("No space left on device") <= 4, err  # rate-limited
            # Killed on the full filesystem, the broker comes back and serves reads.
            c.restart_broker(kill=True)
            with PullConsumer("FullC2", namesrv=c.ns) as consumer:
                assert _pull_all(consumer, mq) == acked
            assert c.broker.alive(), c.broker.stderr()
            assert "Traceback" not in c.broker.stderr()
