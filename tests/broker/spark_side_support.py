"""Helpers for the broker side of the Spark pipeline (dedup, backfill): an in-process broker and raw sends/pulls.

Sends go through the real RemotingClient with an explicit producer group (the dedup opt-in is the group)."""
from __future__ import annotations

import time
from pathlib import Path

from servers import InProcessBroker

from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.batch import encode_batch
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import RecordView, iter_records

SPARK_GROUP = "spark-sluice-writer-test"


class Broker(InProcessBroker):
    """An in-process broker spoken to as the Spark writer speaks: raw sends under a chosen producer group."""

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
