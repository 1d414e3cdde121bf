"""The SDK's trace dispatcher: records made around sends and listener calls, a bounded queue that drops
(counted, logged once) instead of blocking, trace messages packed as AsyncTraceDispatcher packs them, and a
traced producer whose full queue never holds up its sends (real namesrv and broker subprocesses)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from sdk_support import Cluster, running_cluster

from sluice import ConsumeResult, Message
from sluice.client.consume_service import listener_outcome
from sluice.client.producer import AsyncProducer
from sluice.client.trace import MAX_MESSAGE_SIZE, TraceDispatcher
from sluice.errors import InvalidParameterError
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.trace import ConsumeReturnType, TraceType, decode_traces


def _ext(msg_id: str, **props: str) -> MessageExt:
    return MessageExt(topic="Orders", body=b"x", properties={P.UNIQ_KEY: msg_id, **props}, queue_id=0,
                      queue_offset=0, commitlog_offset=0, msg_id=msg_id, offset_msg_id="", sysflag=0, flag=0,
                      born_timestamp=0, born_host=("", 0), store_timestamp=0, store_host=("", 0),
                      reconsume_times=2, body_crc=0, store_size=99)


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)


def _dispatcher(**kw: Any) -> TraceDispatcher:
    return TraceDispatcher(_Recorder(), "RMQ_SYS_TRACE_TOPIC", **kw)


def _queued(d: TraceDispatcher) -> list:
    return d._take()


def test_a_full_queue_drops_counts_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    d = _dispatcher(queue_size=2)
    with caplog.at_level(logging.WARNING, logger="sluice.client.trace"):
        accepted = [d.traced_call("G", lambda m: ConsumeReturnType.SUCCESS, [_ext(f"M{i}")]) for i in range(3)]
    assert accepted == [True, True, True]  # the listener's verdicts: tracing never changes them
    assert d.dropped == 4  # 6 records (SubBefore + SubAfter per call), room for 2
    assert len(_queued(d)) == 2
    assert [r.message for r in caplog.records].count("trace queue full: 1 trace record(s) dropped so far") == 1
    assert len(caplog.records) == 1


def test_listener_calls_are_recorded_with_their_outcome() -> None:
    d = _dispatcher()

    def fails(msgs: list) -> ConsumeResult:
        return ConsumeResult.RECONSUME_LATER

    def raises(msgs: list) -> ConsumeResult:
        raise RuntimeError("boom")

    msgs = [_ext("A", KEYS="k1 k2", TAGS="T"), _ext("B", TRACE_ON="false"), _ext("C")]
    assert d.traced_call("CG", lambda m: listener_outcome(fails, m), msgs) is False
    assert d.traced_call("CG", lambda m: listener_outcome(raises, m), [_ext("D")]) is False
    assert d.traced_call("CG", lambda m: listener_outcome(lambda _: None, m), [_ext("E")]) is False
    assert d.traced_call("CG", lambda m: listener_outcome(lambda _: ConsumeResult.SUCCESS, m), [_ext("F")])
    before, after, *rest = _queued(d)
    assert before.trace_type is TraceType.SubBefore and before.group == "CG"
    assert [(b.msg_id, b.keys, b.tags, b.retry_times, b.body_length) for b in before.beans] == [
        ("A", "k1 k2", "T", 2, 99), ("C", "null", "null", 2, 99)]  # B switched tracing off
    assert (after.trace_type, after.success, after.context_code, after.request_id, after.group) == (
        TraceType.SubAfter, False, ConsumeReturnType.FAILED, before.request_id, "CG")
    codes = [c.context_code for c in rest if c.trace_type is TraceType.SubAfter]
    assert codes == [ConsumeReturnType.EXCEPTION, ConsumeReturnType.RETURNNULL, ConsumeReturnType.SUCCESS]
    # Every message with tracing off: no record at all, and the listener still runs.
    assert d.traced_call("CG", lambda m: ConsumeReturnType.SUCCESS, [_ext("G", TRACE_ON="false")])
    assert _queued(d) == []


def test_records_are_packed_by_topic_into_bounded_messages_keyed_by_msg_id() -> None:
    d = _dispatcher()
    for i in range(100):  # one batch: 100 records, about 4 KB of keys each
        m = _ext(f"ID{i:03d}", KEYS=" ".join(f"key{i}-{j}-{'x' * 40}" for j in range(50)))
        m.topic = "Orders" if i % 2 else "Payments"
        d.sub_before("CG", [m])
    rec = _Recorder()
    asyncio.run(d._flush(rec))  # type: ignore[arg-type]
    assert len(rec.sent) > 2  # over MAX_MESSAGE_SIZE per topic: split
    seen = []
    for m in rec.sent:
        ctxs = decode_traces(m.body)
        assert len({int(c.beans[0].msg_id[2:]) % 2 for c in ctxs}) == 1  # one traced topic per message
        assert len(m.body) < MAX_MESSAGE_SIZE + 5000
        assert all(c.beans[0].msg_id in m.key_list() for c in ctxs)
        seen += [c.beans[0].msg_id for c in ctxs]
    assert sorted(seen) == [f"ID{i:03d}" for i in range(100)]


def test_packed_keys_stay_within_the_properties_limit() -> None:
    # Records with about 1 KB of keys each: 100 of them (one AsyncAppenderRequest) stay under the body limit
    # but not under the record's signed-short properties length; each trace message's KEYS property fits it,
    # and every msgId still keys the message carrying it.
    d = _dispatcher()
    for i in range(1000):
        m = _ext(f"{i:032X}", KEYS=" ".join(f"k{i}-{j}-{'y' * 90}" for j in range(i % 20)))
        d.sub_before("CG", [m])
    rec = _Recorder()
    asyncio.run(d._flush(rec))  # type: ignore[arg-type]
    seen = []
    for m in rec.sent:
        assert len(P.encode_properties(m.all_properties())) <= P.MAX_PROPERTIES_BYTES
        ctxs = decode_traces(m.body)
        assert all(c.beans[0].msg_id in m.key_list() for c in ctxs)
        seen += [c.beans[0].msg_id for c in ctxs]
    assert sorted(seen) == [f"{i:032X}" for i in range(1000)]


class _Instance:
    def find_broker_addr(self, name: str) -> str:
        return {"broker-a": "10.0.0.1:10911"}[name]


class _Producer:
    group = "PG"
    instance = _Instance()


def _result(msg_id: str, offset_id: str, status: str = "SEND_OK") -> Any:
    from sluice.client.results import MessageQueue, SendResult, SendStatus
    return SendResult(SendStatus(status), msg_id, offset_id, MessageQueue(topic="Orders", broker_name="broker-a", queue_id=1), 7)


def test_sends_of_every_kind_are_recorded_as_send_message_trace_hook_impl() -> None:
    from sluice.protocol.trace import MsgType

    async def sent(result: Any) -> Any:
        return result

    async def fails() -> Any:
        raise RuntimeError("no route")

    async def run(d: TraceDispatcher) -> None:
        p = _Producer()
        await d.traced_send(p, Message("Orders", b"abc", tags="T", keys=["k1", "k2"]), sent(_result("A", "OA")))
        await d.traced_send(p, Message("Orders", b"half"), sent(_result("B", "OB", "FLUSH_DISK_TIMEOUT")),
                            MsgType.Trans_Msg_Half)
        await d.traced_send(p, Message("Orders", b"later", delay_level=3), sent(_result("C", "OC")))
        batch = [Message("Orders", b"1", tags="X"), Message("Orders", b"22", keys="kb")]
        await d.traced_send(p, batch, sent(_result("D1,D2", "OD1,OD2")))
        with pytest.raises(RuntimeError, match="no route"):  # a send that raises records nothing
            await d.traced_send(p, Message("Orders", b"lost"), fails())
        await d.traced_send(p, Message("RMQ_SYS_TRACE_TOPIC", b"trace data"), sent(_result("T", "OT")))
        await d.traced_send(p, batch, sent(_result("E1", "OE1")))  # ids that do not match: logged, not raised

    d = _dispatcher()
    asyncio.run(run(d))
    pubs = _queued(d)
    assert all(c.trace_type is TraceType.Pub and c.group == "PG" and c.region_id == "DefaultRegion" for c in pubs)
    rows = [(c.beans[0].msg_id, c.beans[0].offset_msg_id, c.beans[0].tags, c.beans[0].keys, c.beans[0].body_length,
             c.beans[0].msg_type, c.beans[0].store_host, c.success) for c in pubs]
    assert rows == [
        ("A", "OA", "T", "k1 k2", 3, MsgType.Normal_Msg, "10.0.0.1:10911", True),
        ("B", "OB", "null", "null", 4, MsgType.Trans_Msg_Half, "10.0.0.1:10911", False),
        ("C", "OC", "null", "null", 5, MsgType.Delay_Msg, "10.0.0.1:10911", True),
        ("D1", "OD1", "X", "null", 1, MsgType.Normal_Msg, "10.0.0.1:10911", True),
        ("D2", "OD2", "null", "kb", 2, MsgType.Normal_Msg, "10.0.0.1:10911", True)]
    assert pubs[3].timestamp == pubs[4].timestamp and pubs[3].cost_time == pubs[4].cost_time >= 0


def test_end_transaction_is_recorded_as_end_transaction_trace_hook_impl() -> None:
    from sluice.protocol.trace import MsgType
    d = _dispatcher()
    d.end_transaction("PG", Message("Orders", b"x", tags="T"), "U1", "U1", "COMMIT_MESSAGE", False, "h:1")
    d.end_transaction("PG", _ext("U2", KEYS="k", MSG_REGION="R9"), "U2", "U2", "ROLLBACK_MESSAGE", True, "h:2")
    d.end_transaction("PG", Message("RMQ_SYS_TRACE_TOPIC", b"x"), "U3", "U3", "UNKNOW", False, "h:1")
    d.end_transaction("PG", Message("Orders", b"x", keys="a\x01b"), "U4", "U4", "UNKNOW", False, "h:1")
    a, b, bad = _queued(d)
    assert (a.trace_type, a.group, a.region_id, a.timestamp > 0) == (TraceType.EndTransaction, "PG",
                                                                      "DefaultRegion", True)
    assert (a.beans[0].topic, a.beans[0].msg_id, a.beans[0].tags, a.beans[0].keys, a.beans[0].store_host,
            a.beans[0].msg_type, a.beans[0].transaction_id, a.beans[0].transaction_state,
            a.beans[0].from_transaction_check) == ("Orders", "U1", "T", "null", "h:1", MsgType.Trans_msg_Commit,
                                                   "U1", "COMMIT_MESSAGE", False)
    assert (b.region_id, b.beans[0].keys, b.beans[0].transaction_state, b.beans[0].from_transaction_check) == (
        "R9", "k", "ROLLBACK_MESSAGE", True)
    # A record that cannot be encoded is left out when packed, never raised into the transaction.
    rec = _Recorder()
    d.append(bad)
    asyncio.run(d._flush(rec))  # type: ignore[arg-type]
    assert rec.sent == []


def test_a_half_full_queue_wakes_the_sender_and_shutdown_flushes() -> None:
    async def run() -> tuple[int, int]:
        rec = _Recorder()
        d = TraceDispatcher(rec, "RMQ_SYS_TRACE_TOPIC", queue_size=4, flush_interval=3600.0)  # no timed rounds
        await d.start()
        d.sub_before("CG", [_ext("A")])  # a quarter full: waits for the (hour-long) round
        await asyncio.sleep(0)
        first = len(rec.sent)
        d.sub_before("CG", [_ext("B")])  # half full: sent without waiting for the round
        while not rec.sent:
            await asyncio.sleep(0.01)
        d.sub_before("CG", [_ext("C")])
        await d.shutdown()  # what is still queued goes before the sender stops
        return first, sum(len(decode_traces(m.body)) for m in rec.sent)

    assert asyncio.run(run()) == (0, 3)


def test_trace_options_are_checked() -> None:
    with pytest.raises(InvalidParameterError, match="trace_topic"):
        AsyncProducer("G", "127.0.0.1:1", enable_trace=True, trace_topic="no spaces")
    with pytest.raises(InvalidParameterError, match="unknown option"):
        from sluice import PullConsumer
        PullConsumer("G", "127.0.0.1:1", enable_trace=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("trace")) as c:
        yield c


def test_a_full_trace_queue_never_holds_up_sends(cluster: Cluster) -> None:
    topic = "TraceFullQueue"

    async def run() -> tuple[list[str], int, int]:
        async with AsyncProducer("PG_full", cluster.ns, enable_trace=True) as p:
            trace = p.trace
            assert trace is not None and trace._task is not None
            trace._task.cancel()  # nothing drains the queue any more
            trace._max = 1
            statuses = [(await p.send(Message(topic, b"m%d" % i))).status.value for i in range(5)]
            return statuses, trace.dropped, len(trace._queue)

    statuses, dropped, queued = asyncio.run(run())
    assert statuses == ["SEND_OK"] * 5
    assert (dropped, queued) == (4, 1)
