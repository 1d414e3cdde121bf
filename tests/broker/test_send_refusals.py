"""Sends the broker refuses instead of acknowledging and never delivering: transactional messages it cannot
honour (reject_transaction_message, a rolled-back type, a transactional batch) and sends to the system topics only the broker writes (RocketMQ's
TopicValidator.isNotAllowedSendTopic); single and batch sends alike, nothing stored. The broker's own moves
into those topics (delays, consumer retries) do not come through the send path and still work."""
from __future__ import annotations

from typing import Any

import pytest

from broker_support import BrokerHandle, Rpc, bodies
from sluice.broker.schedule import TIMER_TOPIC
from sluice.broker.topics import SCHEDULE_TOPIC
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode

FORBIDDEN_TX = "sending transaction message is forbidden"


def _nothing_stored(broker: BrokerHandle, topic: str) -> bool:
    store = broker.broker.store
    return all(store.get_max_offset(topic, q) == 0 for q in range(8))


@pytest.mark.parametrize("code", [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2])
def test_transactional_sends_the_broker_cannot_honour_are_refused(make_broker: Any, code: int) -> None:
    """reject_transaction_message refuses every half message; a rolled-back type (no consume-queue unit) and a
    transactional batch are refused always. Half messages themselves: tests/broker/test_transactions.py."""
    broker = make_broker(reject_transaction_message=True)
    rpc = broker.rpc()
    assert rpc.send("Tx", b"warm-up", code=code).code == ResponseCode.SUCCESS  # the topic exists, queue 0 at 1
    for kw in ({"sys_flag": 0x4}, {"sys_flag": 0x4 | 0x1}, {"sys_flag": 0xC}, {"props": {P.TRAN_MSG: "true"}}, {"props": {P.TRAN_MSG: "TRUE"}}):
        r = rpc.send("Tx", b"half", code=code, **kw)  # type: ignore[arg-type]
        assert r.code == ResponseCode.NO_PERMISSION and FORBIDDEN_TX in r.remark and "the broker[" in r.remark, kw
        b = rpc.send_batch("Tx", [(b"h1", {}, 0), (b"h2", {}, 0)],
                           properties=P.encode_properties(kw.get("props", {})), sys_flag=kw.get("sys_flag", 0))
        assert b.code == ResponseCode.NO_PERMISSION and FORBIDDEN_TX in b.remark, kw
    assert bodies(rpc.pull("Tx", 0)) == [b"warm-up"]
    assert _nothing_stored(broker, "RMQ_SYS_TRANS_HALF_TOPIC")
    # A committed type and TRAN_MSG=false are ordinary messages: delivered.
    assert rpc.send("Tx", b"commit", sys_flag=0x8).code == ResponseCode.SUCCESS
    assert rpc.send("Tx", b"plain", props={P.TRAN_MSG: "false"}).code == ResponseCode.SUCCESS
    assert bodies(rpc.pull("Tx", 0)) == [b"warm-up", b"commit", b"plain"]
    on = make_broker().rpc()  # transactions on (the default): still no rolled-back type, no transactional batch
    assert on.send("Tx", b"rb", sys_flag=0xC, code=code).code == ResponseCode.NO_PERMISSION
    assert on.send_batch("Tx", [(b"h1", {}, 0)], sys_flag=0x4).code == ResponseCode.MESSAGE_ILLEGAL


@pytest.mark.parametrize("topic", [SCHEDULE_TOPIC, TIMER_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC",
                                   "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "RMQ_SYS_ANYTHING"])
def test_system_topics_are_refused(broker: BrokerHandle, rpc: Rpc, topic: str) -> None:
    remark = f"Sending message to topic[{topic}] is forbidden."
    r = rpc.send(topic, b"x")
    assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, remark)
    b = rpc.send_batch(topic, [(b"a", {}, 0)])
    assert (b.code, b.remark) == (ResponseCode.NO_PERMISSION, remark)
    assert _nothing_stored(broker, topic)


def test_the_trace_topic_and_the_brokers_own_moves_still_work(broker: BrokerHandle, rpc: Rpc) -> None:
    assert rpc.send("RMQ_SYS_TRACE_TOPIC", b"trace").code == ResponseCode.SUCCESS  # clients' message traces
    assert rpc.send("Later", b"d", props={P.DELAY: "3"}).code == ResponseCode.SUCCESS  # diverted by the broker
    assert broker.broker.store.get_max_offset(SCHEDULE_TOPIC, 2) == 1
