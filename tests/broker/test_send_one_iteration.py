"""A read of single sends is served within that read (no task, no later loop iteration): the sends to one queue
are appended in one store call after the read's frames are handled, each request gets its reply, dispatch runs,
and a pull held on the queue that a message matches is answered, all before ``data_received`` returns. The
broker's real request path, fed through in-memory transports."""
from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from sluice.broker.config import BrokerConfig
from sluice.broker.controller import BrokerController
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import iter_records

from recording import RecordingTransport, wire

TOPIC = "OneIteration"


class _Transport(RecordingTransport):
    order: list[str] = []  # which transport wrote, in order, across both

    def write(self, data: bytes | bytearray | memoryview) -> None:
        super().write(data)
        self.order.append(self.name)


def _send(queue_id: int, body: bytes, region: str) -> RemotingCommand:
    h = H.SendMessageRequestHeader(producer_group="PG", topic=TOPIC, queue_id=queue_id, born_timestamp=1,
                                   properties=P.encode_properties({"region": region, P.TAGS: "TagA"}))
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), body)


def _pull(queue_id: int, offset: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(
        consumerGroup="G", topic=TOPIC, queueId=queue_id, queueOffset=offset, maxMsgNums=32, sysFlag=0x2 | 0x4,
        commitOffset=0, suspendTimeoutMillis=60_000, subVersion=1, subscription="region = 'eu'",
        expressionType="SQL92"))


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_reads_single_sends_are_stored_replied_and_wake_their_pull_within_the_read(tmp_path: Path,
                                                                                     flush: str) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:0", store=str(tmp_path / "s"),
                                                    flush=flush))
        await broker.start()
        try:
            producer, pt = broker.server._new_connection(), _Transport("producer")
            pt.connect(producer)
            consumer, ct = broker.server._new_connection(), _Transport("consumer")
            ct.connect(consumer)
            producer.data_received(wire(_send(0, b"create", "none"), 1))  # creates the topic
            while not pt.writes:
                await asyncio.sleep(0.005)
            assert pt.take()[0].code == ResponseCode.SUCCESS
            hb = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
                "groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [{
                    "topic": TOPIC, "subString": "region = 'eu'", "expressionType": "SQL92", "subVersion": 1,
                    "tagsSet": [], "codeSet": []}]}]}
            consumer.data_received(wire(RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(hb)), 1))
            consumer.data_received(wire(_pull(0, 1), 2))  # held: nothing past offset 1 yet
            await asyncio.sleep(0.05)
            assert [f.opaque for f in ct.take() if f.is_response] == [1] and broker.hold.held_count == 1
            jobs = broker.appender.jobs
            replies_before = pt.writes[:]
            assert not replies_before
            sends = [(0, b"a", "us"), (0, b"b", "eu"), (1, b"c", "eu"), (0, b"d", "us")]
            ready = len(loop._ready)  # type: ignore[attr-defined]
            _Transport.order.clear()
            producer.data_received(b"".join(wire(_send(q, body, r), 10 + i) for i, (q, body, r) in
                                            enumerate(sends)))
            if flush == "sync":  # the replies wait for the fsync round; the pull needs only the dispatch
                pulled = ct.take()
                while len(pt.writes) == 0:
                    await asyncio.sleep(0.005)
            else:
                # Within the read: nothing left on the loop (no task, no flush, no firing) but the wake budget's
                # renewal, and every reply and the pull's answer written.
                left = [repr(h) for h in list(loop._ready)[ready:]]  # type: ignore[attr-defined]
                assert all("_next_turn" in h for h in left), left
                assert _Transport.order == ["consumer", "producer"]  # the woken pull's answer first, then replies
                pulled = ct.take()
            replies = pt.take()
            assert sorted(f.opaque for f in replies) == [10, 11, 12, 13]
            assert all(f.code == ResponseCode.SUCCESS for f in replies)
            offsets = {f.opaque: (int(f.ext_fields["queueId"]), int(f.ext_fields["queueOffset"])) for f in replies}
            assert offsets == {10: (0, 1), 11: (0, 2), 12: (1, 0), 13: (0, 3)}
            assert broker.appender.jobs == jobs + 2  # one store call per queue for the read's four sends
            assert len(pulled) == 1 and pulled[0].opaque == 2 and pulled[0].code == ResponseCode.SUCCESS
            assert [bytes(r.body) for r in iter_records(pulled[0].body)] == [b"b"]  # 'us' ones filtered out
            assert broker.gate.in_flight == 0 and producer.busy == 0
        finally:
            await broker.stop()

    asyncio.run(main())


def test_one_connection_gets_the_pull_answer_ahead_of_the_reply_and_the_key_index_follows_the_write(
        tmp_path: Path) -> None:
    """Producer and consumer sharing a connection (the SDK's one client connection): the woken pull's answer and
    the send's reply leave in one write, the answer first (the consumer decodes it first); the key index, which
    neither needs, is built right after that write, before the read's handling returns, and a key query made
    meanwhile still finds the message."""
    async def main() -> None:
        broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:0", store=str(tmp_path / "s")))
        await broker.start()
        try:
            store = broker.store
            seen: list[tuple[bool, list[bytes]]] = []  # per write: key indexed already, key query's bodies

            class _Watching(_Transport):
                def write(self, data: bytes | bytearray | memoryview) -> None:
                    super().write(data)
                    indexed = bool(list(store.index.query_offsets(TOPIC, "key-b", 4, 0, 1 << 62)))
                    found = [m.body for m in store.query_messages_by_key(TOPIC, "key-b")]
                    seen.append((indexed, found))

            conn, t = broker.server._new_connection(), _Watching("both")
            t.connect(conn)
            conn.data_received(wire(_send(0, b"create", "none"), 1))
            while not t.writes:
                await asyncio.sleep(0.005)
            assert t.take()[0].code == ResponseCode.SUCCESS
            hb = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
                "groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [{
                    "topic": TOPIC, "subString": "region = 'eu'", "expressionType": "SQL92", "subVersion": 1,
                    "tagsSet": [], "codeSet": []}]}]}
            conn.data_received(wire(RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(hb)), 2))
            conn.data_received(wire(_pull(0, 1), 3))
            await asyncio.sleep(0.05)
            assert [f.opaque for f in t.take() if f.is_response] == [2] and broker.hold.held_count == 1
            seen.clear()
            h = H.SendMessageRequestHeader(producer_group="PG", topic=TOPIC, queue_id=0, born_timestamp=1,
                                           properties=P.encode_properties({"region": "eu", P.KEYS: "key-b"}))
            conn.data_received(wire(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), b"b"), 10))
            assert len(t.writes) == 1  # the answer and the reply in one write
            out = t.take()
            assert [f.opaque for f in out] == [3, 10]  # the pull's answer first
            assert [bytes(r.body) for r in iter_records(out[0].body)] == [b"b"]
            assert out[1].code == ResponseCode.SUCCESS
            assert seen[0] == (False, [b"b"])  # written before the index entry, which a key query builds first
            # Built before the read's handling returned, whoever asks.
            assert [m.body for m in store.query_messages_by_key(TOPIC, "key-b")] == [b"b"]
        finally:
            await broker.stop()

    asyncio.run(main())
