"""Helpers for tests/sparkbroker: an in-process broker on a free loopback port and raw sends/pulls.

Sends go through the real RemotingClient with an explicit producer group (the dedup opt-in is the group)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sluice.broker.config import BrokerConfig
from sluice.broker.controller import BrokerController
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.batch import encode_batch
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import RecordView, iter_records
from sluice.transport.blocking import LoopThread, SyncRemotingClient

SMALL = 8 * 1024 * 1024
SPARK_GROUP = "spark-sluice-writer-test"


class Broker:
    def __init__(self, store: Path, **settings: Any) -> None:
        self.loop = LoopThread("sparkbroker-test")
        cfg = {"listen": "127.0.0.1:0", "store": str(store), "commitlog_file_size": SMALL, **settings}
        self.broker = BrokerController(BrokerConfig.load(None, **cfg))
        self.loop.run(self.broker.start(), 30)
        self.addr = self.broker.address
        self.client = SyncRemotingClient(self.loop)

    def call(self, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
             timeout: float = 10.0) -> RemotingCommand:
        return self.client.invoke(self.addr, RemotingCommand.request(code, fields or {}, body), timeout)

    def send(self, topic: str, body: bytes, props: dict[str, str], *, group: str = "PG",
             queue_id: int = 0) -> RemotingCommand:
        h = H.SendMessageRequestHeader(producer_group=group, topic=topic, queue_id=queue_id,
                                       properties=P.encode_properties(props), born_timestamp=int(time.time() * 1000))
        return self.call(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), body)

    def send_batch(self, topic: str, entries: list[tuple[bytes, dict[str, str]]], *, group: str = SPARK_GROUP,
                   queue_id: int = 0) -> RemotingCommand:
        h = H.SendMessageRequestHeader(producer_group=group, topic=topic, queue_id=queue_id, batch=True,
                                       born_timestamp=int(time.time() * 1000))
        return self.call(RequestCode.SEND_BATCH_MESSAGE, h.to_v2_ext(),
                         encode_batch([(b, p, 0) for b, p in entries]))

    def pull_all(self, topic: str, queue_id: int, *, group: str = "G", sub: str = "*",
                 expr_type: str | None = None, start: int = 0) -> list[RecordView]:
        """Every message of the queue from ``start`` that passes the subscription (pulls until the end)."""
        self.broker.store.wait_dispatched(5.0)
        out: list[RecordView] = []
        offset = start
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = self.call(RequestCode.PULL_MESSAGE, dict(
                consumerGroup=group, topic=topic, queueId=queue_id, queueOffset=offset, maxMsgNums=32, sysFlag=0x4,
                commitOffset=0, suspendTimeoutMillis=0, subVersion=0, subscription=sub, expressionType=expr_type))
            if r.code == 0:
                out.extend(iter_records(r.body))
            elif r.code != 20:  # 20 PULL_RETRY_IMMEDIATELY: nothing matched in the window, go on
                break
            nxt = int(r.ext_fields["nextBeginOffset"])
            if nxt >= int(r.ext_fields["maxOffset"]) or nxt == offset:
                break
            offset = nxt
        return out

    def stop(self) -> None:
        self.client.close()
        if self.loop.running:
            self.loop.run(self.broker.stop(), 30)
            self.loop.stop()


def write_backfill(out: Path, topic: str, group: str, expression: str, queues: dict[int, tuple[int, list[bool]]],
                   *, expression_type: str = "SQL92", digest_of: str | None = None) -> dict:
    """Files in the layout and format ``sluice spark backfill`` writes (sluice.spark.backfill), from explicit
    bits: ``queues`` maps a queue id to (first offset, bit per offset). ``digest_of`` hashes another
    expression (a bitmap computed for another selector)."""
    import numpy as np
    import orjson

    from sluice.spark.backfill import HEADER, MAGIC, VERSION, selector_hash

    digest = selector_hash(expression_type, digest_of if digest_of is not None else expression)
    manifest: dict = {"topic": topic, "group": group, "expression_type": expression_type, "expression": expression,
                      "selector_sha256": digest.hex(), "queues": {}}
    for qid, (first, bits) in queues.items():
        path = out / topic / str(qid) / f"{group}.bitmap"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(HEADER.pack(MAGIC, VERSION, 0, digest, first, first + len(bits), sum(bits))
                         + np.packbits(np.array(bits, dtype=bool)).tobytes())
        manifest["queues"][str(qid)] = {"first": first, "end": first + len(bits), "matched": sum(bits),
                                        "file": str(path)}
    (out / "manifest.json").write_bytes(orjson.dumps(manifest))
    return manifest
