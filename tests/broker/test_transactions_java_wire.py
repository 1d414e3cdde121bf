"""The Java TransactionMQProducer's wire flow, played with hand-built frames over a plain socket against a real
``sluice broker`` subprocess, so a client nobody here wrote is served: heartbeat naming the producer group;
SEND_MESSAGE_V2 with TRAN_MSG=true, PGROUP and sysFlag 0x4; END_TRANSACTION oneway with
DefaultMQProducerImpl.endTransaction's header fields; and answering CHECK_TRANSACTION_STATE
(ClientRemotingProcessor.checkTransactionState -> DefaultMQProducerImpl.checkTransactionState) on the same
connection. Frames follow RemotingCommand.encode with JSON headers (RemotingSerializable)."""
from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import Cluster, running_cluster, wait_for, wait_for_route

from sluice import PullConsumer
from sluice.protocol.record import decode_record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GROUP = "PG_java_tx"
RPC_ONEWAY = 2  # RemotingCommand's flag bit 1
MAGIC_V1 = 0xDAA320A7


class JavaWire:
    """One connection, framed as Java's NettyEncoder: total length, serialize type << 24 | header length,
    the JSON header, the body."""

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.opaque = 0

    def close(self) -> None:
        self.sock.close()

    def send(self, code: int, ext: dict[str, str], body: bytes = b"", *, oneway: bool = False,
             response_to: int | None = None) -> int:
        self.opaque += 1
        header = {"code": code, "extFields": ext, "flag": RPC_ONEWAY if oneway else 0, "language": "JAVA",
                  "opaque": self.opaque, "serializeTypeCurrentRPC": "JSON", "version": 399}
        raw = json.dumps(header).encode()
        self.sock.sendall(struct.pack(">ii", 4 + len(raw) + len(body), len(raw)) + raw + body)
        return self.opaque

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return out

    def read(self) -> tuple[dict[str, Any], bytes]:
        total, mark = struct.unpack(">ii", self._exact(8))
        assert mark >> 24 == 0, "the broker answers a JSON request in JSON"
        hlen = mark & 0xFFFFFF
        header = json.loads(self._exact(hlen))
        return header, self._exact(total - 4 - hlen)

    def call(self, code: int, ext: dict[str, str], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
        opaque = self.send(code, ext, body)
        while True:
            header, body = self.read()
            if header["flag"] & 1 and header["opaque"] == opaque:  # a response (RPC_TYPE bit 0)
                return header, body


def props(**kv: str) -> str:
    """MessageDecoder.messageProperties2String."""
    return "".join(f"{k}\u0001{v}\u0002" for k, v in kv.items())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = "transaction_check_interval_ms = 300\ntransaction_timeout_ms = 200\n"
    with running_cluster(tmp_path_factory.mktemp("javatx"), config=config) as c:
        yield c


def delivered(ns: str, topic: str) -> list[bytes]:
    out: list[bytes] = []
    with PullConsumer("CG_java_tx_check", ns) as c:
        for mq in c.fetch_message_queues(topic):
            out += [m.body for m in c.pull(mq, "*", 0).msg_found_list]
    return sorted(out)


def half(wire: JavaWire, topic: str, body: bytes, uniq: str) -> dict[str, str]:
    """DefaultMQProducerImpl.sendKernelImpl for a message sendMessageInTransaction prepared."""
    ext = {"a": GROUP, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "4",
           "g": str(int(time.time() * 1000)), "h": "0",
           "i": props(TRAN_MSG="true", PGROUP=GROUP, UNIQ_KEY=uniq, WAIT="true", TAGS="TagA"),
           "j": "0", "k": "false", "m": "false", "n": "broker-a"}
    header, _ = wire.call(310, ext, body)
    assert header["code"] == 0, header
    return header["extFields"]


def end_fields(sent: dict[str, str], state: int, uniq: str) -> dict[str, str]:
    """EndTransactionRequestHeader as DefaultMQProducerImpl.endTransaction fills it (4.x: no transactionId,
    as SendResult.getTransactionId() is null; the commit-log offset from the offset msgId)."""
    offset = int(sent["msgId"][-16:], 16)  # MessageDecoder.decodeMessageId: the last 8 bytes
    return {"producerGroup": GROUP, "tranStateTableOffset": sent["queueOffset"], "commitLogOffset": str(offset),
            "commitOrRollback": str(state), "fromTransactionCheck": "false", "msgId": uniq}


def test_java_transaction_producer_flow(cluster: Cluster, tmp_path: Path) -> None:
    topic = "JavaTxTopic"
    wire = JavaWire(cluster.broker.addr)
    try:
        hb = {"clientID": "127.0.0.1@4242#java", "consumerDataSet": [],
              "producerDataSet": [{"groupName": GROUP}, {"groupName": "CLIENT_INNER_PRODUCER"}]}
        assert wire.call(34, {}, json.dumps(hb).encode())[0]["code"] == 0
        # 1. COMMIT_MESSAGE from executeLocalTransaction; 2. ROLLBACK_MESSAGE; 3. UNKNOW, then the check.
        for body, state, uniq in ((b"java-commit", 8, "AC11000100002A9F0000000000000001"),
                                  (b"java-rollback", 12, "AC11000100002A9F0000000000000002")):
            sent = half(wire, topic, body, uniq)
            wire.send(37, end_fields(sent, state, uniq), oneway=True)
        wait_for_route(cluster.ns, topic)
        assert wait_for(lambda: delivered(cluster.ns, topic), what="the Java commit") == [b"java-commit"]
        uniq = "AC11000100002A9F0000000000000003"
        sent = half(wire, topic, b"java-checked", uniq)
        wire.send(37, end_fields(sent, 0, uniq), oneway=True)
        while True:  # the broker's CHECK_TRANSACTION_STATE: a oneway request on this connection
            header, body = wire.read()
            if header["code"] == 39 and not header["flag"] & 1:
                break
        assert header["flag"] & RPC_ONEWAY
        ext = header["extFields"]
        rec = decode_record(body)  # MessageDecoder.decode: a whole V1 record, real topic and queue
        assert rec.magic == MAGIC_V1 and (rec.topic, rec.queue_id, rec.body) == (topic, 0, b"java-checked")
        assert ext["msgId"] == ext["transactionId"] == uniq
        assert (int(ext["tranStateTableOffset"]), int(ext["commitLogOffset"])) == (rec.queue_offset,
                                                                                   rec.physical_offset)
        assert ext["offsetMsgId"][-16:] == f"{rec.physical_offset:016X}"
        # DefaultMQProducerImpl.checkTransactionState -> endTransactionOneway, fromTransactionCheck=true.
        wire.send(37, {"producerGroup": GROUP, "tranStateTableOffset": ext["tranStateTableOffset"],
                       "commitLogOffset": ext["commitLogOffset"], "commitOrRollback": "8",
                       "fromTransactionCheck": "true", "msgId": uniq, "transactionId": ext["transactionId"]},
                  oneway=True)
        assert wait_for(lambda: len(got := delivered(cluster.ns, topic)) == 2 and got, what="the checked commit") \
            == [b"java-checked", b"java-commit"]
    finally:
        wire.close()
