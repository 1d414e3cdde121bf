"""Transactional messages in an in-process broker (broker/transactions.py): half messages, END_TRANSACTION,
the check-back, discard, and state rebuilt from the half and op topics after a restart."""
from __future__ import annotations

import asyncio
import queue
import time
from pathlib import Path
from typing import Any

import pytest
from broker_support import BrokerHandle, Rpc, bodies, records

from sluice.broker.appender import stored
from sluice.broker.transactions import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC, SYS_GROUP
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import CheckTransactionStateRequestHeader
from sluice.protocol.msgid import decode_offset_msg_id
from sluice.protocol.record import decode_record

FAR = 10 ** 13  # a check time after every half's timeout


def half(rpc: Rpc, topic: str = "TxT", body: bytes = b"tx", group: str = "PG", queue_id: int = 0,
         **props: str) -> RemotingCommand:
    r = rpc.send(topic, body, props={P.TRAN_MSG: "true", P.PGROUP: group, P.UNIQ_KEY: f"U{body.hex()}", **props},
                 sys_flag=0x4, queue_id=queue_id)
    assert r.code == ResponseCode.SUCCESS, r.remark
    return r


def end(rpc: Rpc, sent: RemotingCommand, kind: int, group: str = "PG", **over: Any) -> RemotingCommand:
    f = sent.ext_fields
    fields = {"producerGroup": group, "tranStateTableOffset": int(f["queueOffset"]),
              "commitLogOffset": decode_offset_msg_id(f["msgId"]).offset, "commitOrRollback": kind,
              "fromTransactionCheck": "false", "msgId": "m", **over}
    return rpc.call(RequestCode.END_TRANSACTION, fields)


def op_bodies(broker: BrokerHandle, rpc: Rpc) -> list[bytes]:
    return bodies(rpc.pull(OP_TOPIC, 0))


def check(broker: BrokerHandle, now: int = FAR) -> int:
    return broker.loop.run(broker.broker.transactions.check(now_ms=now), 10)


def test_a_half_message_is_stored_in_the_half_queue_only(broker: BrokerHandle, rpc: Rpc) -> None:
    r = half(rpc, queue_id=2)
    assert r.ext_fields["queueId"] == "2" and r.ext_fields["queueOffset"] == "0"
    assert bodies(rpc.pull("TxT", 2)) == []
    (rec,) = records(rpc.pull(HALF_TOPIC, 0))
    props = P.decode_properties(rec.properties)
    assert (props[P.REAL_TOPIC], props[P.REAL_QID], rec.sysflag & 0xC) == ("TxT", "2", 0)
    assert broker.broker.topics.get(HALF_TOPIC) is not None and broker.broker.topics.get(OP_TOPIC) is not None


def test_commit_delivers_once_with_rocketmq_fields(broker: BrokerHandle, rpc: Rpc) -> None:
    r = half(rpc, body=b"pay", **{P.TAGS: "A", P.KEYS: "k1"})
    assert end(rpc, r, 8).code == ResponseCode.SUCCESS
    (rec,) = records(rpc.pull("TxT", 0))
    props = P.decode_properties(rec.properties)
    assert rec.body == b"pay" and rec.sysflag & 0xC == 0x8
    assert rec.prepared_tx_offset == decode_offset_msg_id(r.ext_fields["msgId"]).offset
    assert P.REAL_TOPIC not in props and P.TRAN_MSG not in props and props[P.PGROUP] == "PG"
    assert props[P.TAGS] == "A" and props[P.UNIQ_KEY] == "U" + b"pay".hex()
    assert bodies(rpc.pull("TxT", 0, sub="B")) == [] and len(bodies(rpc.pull("TxT", 0, sub="A"))) == 1
    (op,) = records(rpc.pull(OP_TOPIC, 0))
    assert (op.body, P.decode_properties(op.properties)[P.TAGS]) == (b"0", "d")
    # A repeat (the Java client's oneway plus a check's answer, say) stores nothing more.
    assert end(rpc, r, 8).code == ResponseCode.SUCCESS and end(rpc, r, 12).code == ResponseCode.SUCCESS
    assert len(bodies(rpc.pull("TxT", 0))) == 1 and op_bodies(broker, rpc) == [b"0"]
    assert broker.broker.transactions.pending == {}


def test_rollback_never_delivers(broker: BrokerHandle, rpc: Rpc) -> None:
    r = half(rpc)
    assert end(rpc, r, 12).code == ResponseCode.SUCCESS
    assert end(rpc, r, 8).code == ResponseCode.SUCCESS  # resolved already: not delivered now either
    assert bodies(rpc.pull("TxT", 0)) == [] and op_bodies(broker, rpc) == [b"0"]
    assert check(broker) == 0


def test_end_transaction_refusals(broker: BrokerHandle, rpc: Rpc) -> None:
    r = half(rpc)
    bad = end(rpc, r, 8, group="Other")
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong")
    bad = end(rpc, r, 8, tranStateTableOffset=5)
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
    assert end(rpc, r, 7).code == ResponseCode.INVALID_PARAMETER
    plain = rpc.send("TxT", b"plain")
    bad = end(rpc, plain, 8)
    assert bad.code == ResponseCode.SYSTEM_ERROR and "Find prepared transaction message failed" in bad.remark
    assert end(rpc, r, 0).code == ResponseCode.SUCCESS  # unknown: left for the check
    assert check(broker, now=0) == 0  # reads the half queue: one undecided, none due
    assert bodies(rpc.pull("TxT", 0)) == [b"plain"] and len(broker.broker.transactions.pending) == 1


def test_refused_when_the_broker_rejects_transactions_and_in_batches(make_broker: Any) -> None:
    b = make_broker(reject_transaction_message=True)
    rpc = b.rpc()
    r = rpc.send("TxT", b"h", props={P.TRAN_MSG: "true", P.PGROUP: "PG"})
    assert r.code == ResponseCode.NO_PERMISSION and "sending transaction message is forbidden" in r.remark
    b2 = make_broker()
    rpc2 = b2.rpc()
    r = rpc2.send_batch("TxT", [(b"a", {}, 0)], properties=P.encode_properties({P.TRAN_MSG: "true"}))
    assert r.code == ResponseCode.MESSAGE_ILLEGAL and "does not support transaction" in r.remark
    assert rpc2.send("TxT", b"rb", sys_flag=0xC).code == ResponseCode.NO_PERMISSION


def test_check_copies_the_half_and_a_commit_quoting_either_copy_resolves_it(broker: BrokerHandle, rpc: Rpc) -> None:
    r = half(rpc)
    assert check(broker, now=int(time.time() * 1000)) == 0  # not yet timed out
    assert check(broker) == 1  # no producer: counted anyway, as RocketMQ does
    svc = broker.broker.transactions
    assert svc.no_producer == 1
    recs = records(rpc.pull(HALF_TOPIC, 0))
    assert len(recs) == 2
    props = P.decode_properties(recs[1].properties)
    assert (props["TRANSACTION_CHECK_TIMES"], props["TRAN_PREPARED_QUEUE_OFFSET"]) == ("1", "0")
    assert svc.progress()[0] == 1  # the half queue's progress moved past the first copy
    assert broker.broker.offsets.query(SYS_GROUP, HALF_TOPIC, 0) == 1
    assert end(rpc, r, 8).code == ResponseCode.SUCCESS  # the original offsets
    assert bodies(rpc.pull("TxT", 0)) == [b"tx"]
    assert sorted(op_bodies(broker, rpc)) == [b"0", b"1"]  # both copies named
    assert check(broker) == 0 and svc.pending == {}


def test_discarded_after_check_max(make_broker: Any, tmp_path: Path) -> None:
    b = make_broker(tmp_path / "s", transaction_check_max=2)
    rpc = b.rpc()
    half(rpc)
    for _ in range(3):
        check(b)
    assert b.broker.transactions.discarded == 1 and b.broker.transactions.pending == {}
    (kept,) = records(rpc.pull(CHECK_MAX_TOPIC, 0))
    assert P.decode_properties(kept.properties)[P.REAL_TOPIC] == "TxT"
    b.stop()
    again = make_broker(tmp_path / "s", transaction_check_max=2)
    assert again.broker.transactions.pending == {}


def test_state_survives_a_restart(make_broker: Any, tmp_path: Path) -> None:
    b = make_broker(tmp_path / "s")
    rpc = b.rpc()
    r1, r2, r3 = half(rpc, body=b"1"), half(rpc, body=b"2"), half(rpc, body=b"3")
    assert end(rpc, r1, 8).code == ResponseCode.SUCCESS
    check(b)  # copies 2 and 3 (checked once)
    assert end(rpc, r3, 12).code == ResponseCode.SUCCESS
    b.stop()
    b = make_broker(tmp_path / "s")
    rpc = b.rpc()
    svc = b.broker.transactions
    assert [(p.key, p.checks) for p in svc.pending.values()] == [(1, 1)]
    assert end(rpc, r1, 8).code == ResponseCode.SUCCESS  # still resolved: not stored twice
    assert end(rpc, r2, 8).code == ResponseCode.SUCCESS
    assert bodies(rpc.pull("TxT", 0)) == [b"1", b"2"] and svc.pending == {}


def test_check_goes_to_a_live_producer_with_the_copy(broker: BrokerHandle, rpc: Rpc) -> None:
    got: queue.Queue[RemotingCommand] = queue.Queue()

    async def on_check(conn: Any, request: RemotingCommand) -> None:
        got.put(request)

    rpc.client.client.register(RequestCode.CHECK_TRANSACTION_STATE, on_check)
    assert rpc.heartbeat("cid-1", "", [], producer_group="PG").code == ResponseCode.SUCCESS
    r = half(rpc, body=b"chk", **{P.TAGS: "T"})
    check(broker)
    req = got.get(timeout=5)
    h = CheckTransactionStateRequestHeader.from_command(req)
    rec = decode_record(req.body)
    assert (rec.topic, rec.queue_id, rec.body, rec.queue_offset) == ("TxT", 0, b"chk", h.tran_state_table_offset)
    assert h.tran_state_table_offset == 1 and h.commit_log_offset == rec.physical_offset
    assert h.msg_id == h.transaction_id == "U" + b"chk".hex()
    assert decode_offset_msg_id(h.offset_msg_id).offset == h.commit_log_offset
    # The producer answers as the Java client does: oneway, quoting the check's offsets.
    rpc.oneway(RequestCode.END_TRANSACTION, {
        "producerGroup": "PG", "tranStateTableOffset": h.tran_state_table_offset,
        "commitLogOffset": h.commit_log_offset, "commitOrRollback": 8, "fromTransactionCheck": "true",
        "msgId": h.msg_id, "transactionId": h.transaction_id})
    assert _wait(lambda: bodies(rpc.pull("TxT", 0)) == [b"chk"])
    assert end(rpc, r, 8).code == ResponseCode.SUCCESS and bodies(rpc.pull("TxT", 0)) == [b"chk"]


def _wait(pred: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


class _Peer:
    peer = "127.0.0.1:1"


def test_a_commit_while_the_check_copies_resolves_the_copy_too(make_broker: Any, tmp_path: Path) -> None:
    """END_TRANSACTION arriving while the check appends the half's copy: the copy gets its op record too, so
    neither this broker nor a restarted one checks (or delivers) it again."""
    b = make_broker(tmp_path / "s")
    rpc = b.rpc()
    r = half(rpc)
    svc = b.broker.transactions
    real_put = svc.appender.put

    async def scenario() -> None:
        gate, entered = asyncio.Event(), asyncio.Event()

        def put(topic: str, qid: int, payload: Any, **kw: Any) -> Any:
            res = real_put(topic, qid, payload, **kw)
            if topic != HALF_TOPIC:
                return res

            async def later() -> Any:
                entered.set()
                await gate.wait()
                return await stored(res)
            return later()
        svc.appender.put = put  # type: ignore[method-assign]
        try:
            task = asyncio.get_running_loop().create_task(svc.check(now_ms=FAR))
            await entered.wait()
            f = r.ext_fields
            req = RemotingCommand.request(RequestCode.END_TRANSACTION, {
                "producerGroup": "PG", "tranStateTableOffset": f["queueOffset"],
                "commitLogOffset": decode_offset_msg_id(f["msgId"]).offset, "commitOrRollback": 8, "msgId": "m"})
            assert (await svc.end_transaction(_Peer(), req)).code == ResponseCode.SUCCESS  # type: ignore[arg-type]
            gate.set()
            await task
        finally:
            svc.appender.put = real_put  # type: ignore[method-assign]
    b.loop.run(scenario(), 10)
    assert bodies(rpc.pull("TxT", 0)) == [b"tx"] and sorted(op_bodies(b, rpc)) == [b"0", b"1"]
    assert svc.pending == {} and check(b) == 0
    b.stop()
    again = make_broker(tmp_path / "s")
    assert again.broker.transactions.pending == {} and bodies(again.rpc().pull("TxT", 0)) == [b"tx"]


def test_commits_ahead_of_the_half_queue_read_are_bounded(broker: BrokerHandle, rpc: Rpc,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits of halves the service has not read yet are remembered until the read passes them; past
    AHEAD_READ of them the read catches up at once."""
    import sluice.broker.transactions as T
    monkeypatch.setattr(T, "AHEAD_READ", 3)
    svc = broker.broker.transactions
    sent = [half(rpc, body=bytes([65 + i])) for i in range(5)]
    for r in sent[:2]:
        assert end(rpc, r, 8).code == ResponseCode.SUCCESS
    assert svc._ahead == {0, 1}
    assert end(rpc, sent[2], 12).code == ResponseCode.SUCCESS  # the third: the read catches up
    assert _wait(lambda: not svc._ahead) and set(svc.pending) == {3, 4}
    assert end(rpc, sent[0], 8).code == ResponseCode.SUCCESS  # a repeat, after the read passed it
    assert sorted(bodies(rpc.pull("TxT", 0))) == [b"A", b"B"]


def test_check_immunity_time_defers_the_first_check(broker: BrokerHandle, rpc: Rpc) -> None:
    half(rpc, body=b"imm", **{"CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"})
    half(rpc, body=b"short", **{"CHECK_IMMUNITY_TIME_IN_SECONDS": "1"})  # below the timeout: the timeout wins
    born = int(time.time() * 1000)
    assert check(broker, now=born + 6_000 + 5_000) == 1  # only "short" is due
    assert check(broker, now=born + 3_600_000 + 5_000) == 2
