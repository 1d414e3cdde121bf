"""Helpers for the filtering tests: an in-process store wired like the broker's, an in-process broker on
a free port with a raw remoting client, and message factories. (A uniquely named module: conftest.py
names clash across test folders.)"""
from __future__ import annotations

import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import broker_support
import orjson
import servers

from sluice.broker.bitmap import CalcBitmapDispatcher
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.filter import BloomFilter
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import iter_records
from sluice.store import MessageStore, StoreConfig, StoreMessage

SMALL = servers.SMALL
REGIONS = ("eu", "us", "cn", "jp")
TAGS = ("TagA", "TagB", "TagC", None)


def small_store_config(**kw: Any) -> StoreConfig:
    base: dict[str, Any] = dict(commitlog_file_size=SMALL, consumequeue_units_per_file=4096,
                                consumequeue_ext_file_size=256 * 1024, index_enable=False, checkpoint_interval_ms=200)
    base.update(kw)
    return StoreConfig(**base)


class FilteredStore:
    """A MessageStore with a ConsumerFilterManager and the bitmap dispatcher, as the broker wires them."""

    def __init__(self, root: Path, *, bitmaps: bool = True, store_config: StoreConfig | None = None,
                 manager: ConsumerFilterManager | None = None) -> None:
        self.manager = manager or ConsumerFilterManager(root / "config", bloom=BloomFilter(20, 32))
        self.store = MessageStore(root, store_config or small_store_config())
        self.dispatcher = CalcBitmapDispatcher(self.manager) if bitmaps else None
        if self.dispatcher is not None:
            self.store.add_dispatcher(self.dispatcher)
        self.store.start()

    def close(self) -> None:
        self.store.close()


def props_of(i: int, rng: random.Random | None = None) -> dict[str, str]:
    r = rng or random.Random(i)
    p = {"a": str(r.randrange(0, 1000)), "region": r.choice(REGIONS), "n": str(i)}
    tag = r.choice(TAGS)
    if tag:
        p[P.TAGS] = tag
    if r.random() < 0.1:
        p["odd"] = "abc"  # a non-numeric value: 'odd > 1' is an evaluation error
    return p


def put(store: MessageStore, topic: str, props: Iterable[dict[str, str]], queue_id: int = 0,
        batch: int = 256) -> None:
    msgs = [StoreMessage(topic, f"m{p.get('n', '')}".encode(), queue_id, dict(p)) for p in props]
    for i in range(0, len(msgs), batch):
        store.put_messages(msgs[i:i + batch])
    assert store.wait_dispatched(10.0)


def pull_all(store: MessageStore, topic: str, mf: Any, queue_id: int = 0, max_msgs: int = 32) -> list[int]:
    """Queue offsets a consumer with filter ``mf`` receives, pulling the queue to its end."""
    from sluice.store.types import GetMessageStatus as S
    got: list[int] = []
    off = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        res = store.get_messages(topic, queue_id, off, max_msgs, mf)
        if res.status is S.FOUND:
            got += res.queue_offsets
        elif res.status not in (S.NO_MATCHED_MESSAGE, S.OFFSET_TOO_SMALL):
            break
        off = res.next_begin_offset
    return got


# ---- a broker in this process ------------------------------------------------------------------------
class Rpc(broker_support.Rpc):
    """broker_support's raw client, speaking SQL92 subscriptions by default and sending with explicit properties."""

    def send(self, topic: str, body: bytes, props: dict[str, str], queue_id: int = 0) -> RemotingCommand:
        h = H.SendMessageRequestHeader(producer_group="PG", topic=topic, queue_id=queue_id,
                                       properties=P.encode_properties(props), born_timestamp=int(time.time() * 1000))
        return self.call(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), body)

    def pull(self, topic: str, offset: int = 0, *, group: str = "G", sub: str | None = None,
             expr_type: str | None = "SQL92", inline: bool = True, max_msgs: int = 32, queue_id: int = 0,
             sub_version: int = 0) -> RemotingCommand:
        if self.settle is not None:
            self.settle()
        fields = dict(consumerGroup=group, topic=topic, queueId=queue_id, queueOffset=offset, maxMsgNums=max_msgs,
                      sysFlag=0x4 if inline else 0, commitOffset=0, suspendTimeoutMillis=0, subVersion=sub_version,
                      subscription=sub, expressionType=expr_type)
        return self.call(RequestCode.PULL_MESSAGE, fields)

    def pull_all(self, topic: str, **kw: Any) -> list[bytes]:
        out: list[bytes] = []
        off = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = self.pull(topic, off, **kw)
            if r.code == 0:
                out += [bytes(rec.body) for rec in iter_records(r.body)]
            elif r.code != 20:  # PULL_RETRY_IMMEDIATELY
                break
            off = int(r.ext_fields["nextBeginOffset"])
        return out

    def heartbeat(self, client_id: str, group: str, subs: list[dict[str, Any]]) -> RemotingCommand:
        body = {"clientID": client_id, "consumerDataSet": [{
            "groupName": group, "subscriptionDataSet": subs, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET"}], "producerDataSet": []}
        return self.call(RequestCode.HEART_BEAT, {}, orjson.dumps(body))

    def consume_stats(self, group: str, topic: str | None = None) -> dict:
        r = self.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, **({"topic": topic} if topic else {})})
        assert r.code == 0, r.remark
        return orjson.loads(r.body)


def sub_data(topic: str, expr: str, expr_type: str = "SQL92", version: int | None = None) -> dict[str, Any]:
    return {"topic": topic, "subString": expr, "expressionType": expr_type, "tagsSet": [], "codeSet": [],
            "subVersion": int(time.time() * 1000) if version is None else version}


class InProcessBroker(servers.InProcessBroker):
    """An in-process broker whose ``rpc()`` clients speak SQL92 subscriptions by default."""

    def rpc(self) -> Rpc:
        r = Rpc(self.addr, settle=lambda: self.broker.store.wait_dispatched(5.0))
        self.close_on_stop(r.close)
        return r
