"""Bounded pull answers: a per-pull message cap and byte cap whatever the pull asks, the first record always
served, and no answer over the 16 MiB frame real clients accept (RocketMQ's DefaultMessageStore.isTheBatchFull,
maxTransferCountOnMessageInMemory / maxTransferBytesOnMessageInMemory)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from broker_support import Rpc, records

from sluice.broker.config import BrokerConfig
from sluice.errors import InvalidParameterError
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.store import MessageStore, StoreMessage
from sluice.store.config import MAX_FRAME, PULL_BODY_CEILING, StoreConfig

R = ResponseCode
KiB, MiB = 1024, 1024 * 1024


def _fill(rpc: Rpc, topic: str, body_size: int, count: int, per_batch: int = 16) -> None:
    sent = 0
    while sent < count:
        n = min(per_batch, count - sent)
        entries = [(bytes([65 + (sent + i) % 26]) * body_size, {}, 0) for i in range(n)]
        assert rpc.send_batch(topic, entries).code == R.SUCCESS
        sent += n


def _raw_pull(rpc: Rpc, topic: str, offset: int, *, max_msgs: int = 1_000_000, max_bytes: int | None = 1 << 40):
    """A pull as an abusive client sends it: huge maxMsgNums and maxMsgBytes."""
    rpc.settle()
    fields = dict(consumerGroup="G", topic=topic, queueId=0, queueOffset=offset, maxMsgNums=max_msgs, sysFlag=0x4,
                  commitOffset=0, suspendTimeoutMillis=0, subVersion=0, subscription="*")
    if max_bytes is not None:
        fields["maxMsgBytes"] = max_bytes
    return rpc.call(RequestCode.PULL_MESSAGE, fields, timeout=30)


def _drain(rpc: Rpc, topic: str, total: int, limit: int) -> list[int]:
    """Pull everything with huge pulls; every answer within ``limit``; returns the answers' message counts."""
    offset, counts = 0, []
    for _ in range(total + 1):  # bounded: each answer carries at least one message
        if offset == total:
            break
        resp = _raw_pull(rpc, topic, offset)
        assert resp.code == R.SUCCESS, (resp.code, resp.remark)
        assert len(resp.body) <= limit
        recs = records(resp)
        assert [r.queue_offset for r in recs] == list(range(offset, offset + len(recs)))
        assert int(resp.ext_fields["nextBeginOffset"]) == offset + len(recs)
        offset += len(recs)
        counts.append(len(recs))
    assert offset == total
    return counts


@pytest.mark.slow
def test_a_huge_pull_over_a_big_queue_is_bounded_and_the_client_continues(make_broker):
    b = make_broker()
    rpc = b.rpc()
    total = 272  # 272 x 64 KiB bodies: 17 MiB in the queue
    _fill(rpc, "Big", 64 * KiB, total)
    counts = _drain(rpc, "Big", total, 256 * KiB)  # the default byte cap
    assert max(counts) == 3 and sum(counts) == total  # 3 records of 64 KiB + headers fit 256 KiB, 4 do not
    # the normal client is still served: a plain pull of 32
    assert len(records(rpc.pull("Big", offset=100))) == 3


@pytest.mark.parametrize("on_loop", [True, False])
def test_the_message_cap_holds_whatever_maxmsgnums_says(make_broker, on_loop):
    b = make_broker(max_transfer_count=5, pull_on_event_loop=on_loop)
    rpc = b.rpc()
    _fill(rpc, "Small", 10, 23)
    assert _drain(rpc, "Small", 23, 64 * KiB) == [5, 5, 5, 5, 3]


def test_the_byte_cap_holds_and_maxmsgbytes_only_lowers_it(make_broker):
    b = make_broker(max_transfer_bytes=64 * KiB)
    rpc = b.rpc()
    _fill(rpc, "Mid", 4 * KiB, 40)
    resp = _raw_pull(rpc, "Mid", 0)
    n = len(records(resp))
    size = len(resp.body) // n  # the records are all the same size
    assert len(resp.body) <= 64 * KiB and n == 64 * KiB // size
    assert int(resp.ext_fields["nextBeginOffset"]) == n
    low = _raw_pull(rpc, "Mid", 0, max_bytes=10 * KiB)
    assert len(records(low)) == 2 and len(low.body) <= 10 * KiB
    assert len(records(_raw_pull(rpc, "Mid", 0, max_bytes=None))) == n  # no maxMsgBytes: the cap


def test_the_first_record_is_served_even_above_the_byte_cap(make_broker):
    b = make_broker(max_transfer_bytes=1024)
    rpc = b.rpc()
    _fill(rpc, "Fat", 8 * KiB, 3)
    assert _drain(rpc, "Fat", 3, 8 * KiB + 1024) == [1, 1, 1]


@pytest.mark.slow
def test_the_frame_ceiling_holds_with_the_largest_bodies(make_broker):
    b = make_broker(max_transfer_bytes=PULL_BODY_CEILING)
    rpc = b.rpc()
    _fill(rpc, "Huge", 4 * MiB - 1024, 5, per_batch=1)  # 20 MiB in 4 MiB messages (max_message_size)
    counts = _drain(rpc, "Huge", 5, PULL_BODY_CEILING)
    assert counts == [3, 2]  # 4 records are more than 16 MiB - 64 KiB: never one frame
    assert PULL_BODY_CEILING < MAX_FRAME


@pytest.mark.parametrize("setting", [dict(max_transfer_bytes=MAX_FRAME), dict(max_transfer_bytes=0),
                                     dict(max_transfer_count=0)])
def test_a_cap_above_the_ceiling_is_refused(setting):
    with pytest.raises(InvalidParameterError, match=next(iter(setting))):
        BrokerConfig.load(None, **setting)
    if "max_transfer_bytes" in setting:
        with pytest.raises(InvalidParameterError, match="max_transfer_bytes"):
            StoreConfig(**setting)


def test_the_store_never_answers_past_the_ceiling_whatever_the_caller_asks(tmp_path):
    with MessageStore(tmp_path / "s", StoreConfig(commitlog_file_size=8 * MiB)) as store:
        for i in range(5):
            store.put_messages([StoreMessage("S", bytes([65 + i]) * (4 * MiB - 1024))])
        store.wait_dispatched(10)
        got = store.get_messages("S", 0, 0, 1_000_000, max_bytes=1 << 40)
        assert got.message_count == 3 and len(got.data) <= PULL_BODY_CEILING and got.next_begin_offset == 3


def test_a_max_message_size_that_could_not_be_pulled_is_refused():
    with pytest.raises(InvalidParameterError, match="max_message_size"):
        StoreConfig(max_message_size=16 * MiB, commitlog_file_size=64 * MiB)


def test_the_broker_refuses_to_start_over_the_ceiling(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'listen = "127.0.0.1:0"\nstore = "{tmp_path / "s"}"\nmax_transfer_bytes = {32 * MiB}\n')
    proc = subprocess.run([sys.executable, "-m", "sluice", "broker", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "max_transfer_bytes" in proc.stderr and str(MAX_FRAME) in proc.stderr
    assert not (tmp_path / "s").exists()
