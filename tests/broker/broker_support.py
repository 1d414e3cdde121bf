"""Helpers for the broker tests: an in-process broker on a free loopback port and a raw-remoting client.

Kept out of conftest.py so test modules import them by a unique name (several test folders have a conftest)."""
from __future__ import annotations

import time
from typing import Any

import orjson
from servers import InProcessBroker

from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.batch import encode_batch
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import RecordView, iter_records
from sluice.transport.blocking import LoopThread, SyncRemotingClient


class Rpc:
    """Raw requests to one broker through the real RemotingClient (no SDK)."""

    def __init__(self, addr: str, loop: LoopThread | None = None, settle: Any = None) -> None:
        self.addr = addr
        self.client = SyncRemotingClient(loop)
        #: Called before each pull: sends are acknowledged before dispatch makes them visible (as in
        #: RocketMQ), so a test that pulls right after sending first lets dispatch catch up.
        self.settle = settle

    def call(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
             timeout: float = 5.0) -> RemotingCommand:
        return self.client.invoke(self.addr, RemotingCommand.request(code, fields or {}, body), timeout)

    def oneway(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"") -> None:
        self.client.invoke_oneway(self.addr, RemotingCommand.request(code, fields or {}, body, oneway=True))

    def send(self, topic: str, body: bytes = b"x", *, tags: str | None = None, keys: str | None = None,
             props: dict[str, str] | None = None, queue_id: int = 0, code: int = RequestCode.SEND_MESSAGE_V2,
             **extra: Any) -> RemotingCommand:
        p = dict(props or {})
        if tags:
            p[P.TAGS] = tags
        if keys:
            p[P.KEYS] = keys
        h = H.SendMessageRequestHeader(producer_group="PG", topic=topic, queue_id=queue_id,
                                       properties=P.encode_properties(p), born_timestamp=int(time.time() * 1000),
                                       **extra)
        ext = h.to_ext() if code == RequestCode.SEND_MESSAGE else h.to_v2_ext()
        return self.call(code, ext, body)

    def send_batch(self, topic: str, entries: list[tuple[bytes, dict[str, str], int]], *, queue_id: int = 0,
                   code: int = RequestCode.SEND_BATCH_MESSAGE, **extra: Any) -> RemotingCommand:
        h = H.SendMessageRequestHeader(producer_group="PG", topic=topic, queue_id=queue_id, batch=True, **extra)
        ext = h.to_ext() if code == RequestCode.SEND_MESSAGE else h.to_v2_ext()
        return self.call(code, ext, encode_batch(entries))

    def pull(self, topic: str, queue_id: int = 0, offset: int = 0, *, group: str = "G", max_msgs: int = 32,
             sub: str | None = "*", expr_type: str | None = None, sys_flag: int | None = None,
             suspend_ms: int = 0, commit_offset: int = 0, timeout: float = 5.0) -> RemotingCommand:
        if self.settle is not None:
            self.settle()
        if sys_flag is None:
            sys_flag = (0x4 if sub is not None else 0) | (0x2 if suspend_ms else 0)
        fields = dict(consumerGroup=group, topic=topic, queueId=queue_id, queueOffset=offset, maxMsgNums=max_msgs,
                      sysFlag=sys_flag, commitOffset=commit_offset, suspendTimeoutMillis=suspend_ms, subVersion=0,
                      subscription=sub, expressionType=expr_type)
        return self.call(RequestCode.PULL_MESSAGE, fields, timeout=timeout + suspend_ms / 1000)

    def heartbeat(self, client_id: str, group: str, subs: list[dict[str, Any]], *, ordinals: bool = False,
                  producer_group: str | None = None) -> RemotingCommand:
        consumer = {"groupName": group, "subscriptionDataSet": subs}
        if ordinals:  # librocketmq: enum ordinals, no expressionType, zero codeSet
            consumer.update(consumeType=1, messageModel=1, consumeFromWhere=0)
        else:
            consumer.update(consumeType="CONSUME_PASSIVELY", messageModel="CLUSTERING",
                            consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
        body = {"clientID": client_id, "consumerDataSet": [consumer] if group else [],
                "producerDataSet": [{"groupName": producer_group}] if producer_group else []}
        return self.call(RequestCode.HEART_BEAT, {}, orjson.dumps(body))

    def close(self) -> None:
        self.client.close()


def sub_data(topic: str, expr: str = "*", expr_type: str | None = None, *, zero_codes: bool = False) -> dict:
    d: dict[str, Any] = {"topic": topic, "subString": expr, "subVersion": int(time.time() * 1000),
                         "tagsSet": [t.strip() for t in expr.split("||")] if expr != "*" and not expr_type else []}
    if zero_codes:
        d["codeSet"] = [0, 0]
    if expr_type:
        d["expressionType"] = expr_type
    return d


def records(resp: RemotingCommand) -> list[RecordView]:
    return list(iter_records(resp.body))


def bodies(resp: RemotingCommand) -> list[bytes]:
    return [bytes(r.body) for r in records(resp)]


class BrokerHandle(InProcessBroker):
    """An in-process broker whose ``rpc()`` clients settle dispatch before each pull."""

    def rpc(self) -> Rpc:
        r = Rpc(self.addr, settle=lambda: self.broker.store.wait_dispatched(5.0))
        self.close_on_stop(r.close)
        return r
