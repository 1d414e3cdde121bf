"""Request-reply on the wire as Java's clients play it, with hand-built frames against a real ``sluice broker``:
a requester (heartbeat as a producer, SEND_MESSAGE_V2 carrying CORRELATION_ID / REPLY_TO_CLIENT / TTL, which
the broker stamps with CLUSTER), a replier sending SEND_REPLY_MESSAGE_V2 (325) to ``<cluster>_REPLY_TOPIC``, and
the broker's PUSH_REPLY_MESSAGE_TO_CLIENT (326) on the requester's connection, answered as
ClientRemotingProcessor.receiveReplyMessage answers; a reply for a client not connected is SYSTEM_ERROR naming
it; with store_reply_message_enable off nothing is stored."""
from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import Cluster, running_cluster, start_cluster, wait_for_route
from test_transactions_java_wire import JavaWire, props

from sluice import PullConsumer
from sluice.message import MessageExt

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"
CLIENT = "10.1.2.3@requester#java"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("javareply")) as c:
        yield c


def respond(wire: JavaWire, opaque: int, code: int = 0) -> None:
    """A response frame (RPC_TYPE bit set) to the broker's request ``opaque``."""
    header = {"code": code, "extFields": {}, "flag": 1, "language": "JAVA", "opaque": opaque,
              "serializeTypeCurrentRPC": "JSON", "version": 399}
    raw = json.dumps(header).encode()
    wire.sock.sendall(struct.pack(">ii", 4 + len(raw), len(raw)) + raw)


def send_ext(group: str, topic: str, properties: str) -> dict[str, str]:
    """SendMessageRequestHeaderV2 as sendKernelImpl fills it."""
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": str(int(time.time() * 1000)),
            "h": "0", "i": properties, "j": "0", "k": "false", "m": "false", "n": "broker-a"}


def stored(ns: str, topic: str) -> list[MessageExt]:
    with PullConsumer("CG_java_reply_check", ns) as c:
        return [m for mq in c.fetch_message_queues(topic) for m in c.pull(mq, "*", 0).msg_found_list]


def read_until(wire: JavaWire, pred: Any) -> tuple[dict[str, Any], bytes]:
    while True:
        header, body = wire.read()
        if pred(header):
            return header, body


def test_java_request_reply_flow(cluster: Cluster) -> None:
    requester, replier = JavaWire(cluster.broker.addr), JavaWire(cluster.broker.addr)
    try:
        hb = {"clientID": CLIENT, "consumerDataSet": [], "producerDataSet": [{"groupName": "PG_java_req"}]}
        assert requester.call(34, {}, json.dumps(hb).encode())[0]["code"] == 0
        # The request (prepareSendRequest's properties); the broker adds CLUSTER for the replier.
        req_props = props(CORRELATION_ID="cid-1", REPLY_TO_CLIENT=CLIENT, TTL="3000",
                          UNIQ_KEY="AC11000100002A9F0000000000000101")
        header, _ = requester.call(310, send_ext("PG_java_req", "JavaReqTopic", req_props), b"question")
        assert header["code"] == 0, header
        wait_for_route(cluster.ns, "JavaReqTopic")
        (request,) = stored(cluster.ns, "JavaReqTopic")
        assert request.properties["CLUSTER"] == "DefaultCluster"
        # The reply (MessageUtil.createReplyMessage), sent as SEND_REPLY_MESSAGE_V2.
        reply_props = props(MSG_TYPE="reply", CORRELATION_ID="cid-1", REPLY_TO_CLIENT=CLIENT, TTL="3000",
                            UNIQ_KEY="AC11000100002A9F0000000000000102")
        opaque = replier.send(325, send_ext("PG_java_rep", REPLY_TOPIC, reply_props), b"answer")
        push, body = read_until(requester, lambda h: h["code"] == 326 and not h["flag"] & 1)
        ext = push["extFields"]
        assert body == b"answer"
        assert (ext["topic"], ext["producerGroup"], ext["queueId"]) == (REPLY_TOPIC, "PG_java_rep", "0")
        assert ext["bornHost"].startswith("/127.0.0.1:") and ext["storeHost"].startswith("/")
        assert int(ext["storeTimestamp"]) > 0
        pushed = dict(kv.split("\x01") for kv in ext["properties"].split("\x02") if kv)
        assert pushed["CORRELATION_ID"] == "cid-1" and pushed["MSG_TYPE"] == "reply" and "PUSH_REPLY_TIME" in pushed
        respond(requester, push["opaque"])
        answer, _ = read_until(replier, lambda h: h["flag"] & 1 and h["opaque"] == opaque)
        assert answer["code"] == 0, answer
        assert len(answer["extFields"]["msgId"]) == 32  # stored: the offset message id
        # A reply to a client that is not connected: SYSTEM_ERROR naming it (stored all the same).
        gone = props(MSG_TYPE="reply", CORRELATION_ID="cid-2", REPLY_TO_CLIENT="10.9.9.9@gone#java", TTL="3000")
        answer, _ = replier.call(325, send_ext("PG_java_rep", REPLY_TOPIC, gone), b"too late")
        assert answer["code"] == 1 and "channel of <10.9.9.9@gone#java> not found" in answer["remark"]
        # A requester that refuses the push: SYSTEM_ERROR too.
        opaque = replier.send(325, send_ext("PG_java_rep", REPLY_TOPIC, reply_props), b"refused")
        push, _ = read_until(requester, lambda h: h["code"] == 326 and not h["flag"] & 1)
        respond(requester, push["opaque"], code=1)
        answer, _ = read_until(replier, lambda h: h["flag"] & 1 and h["opaque"] == opaque)
        assert answer["code"] == 1 and CLIENT in answer["remark"]
    finally:
        requester.close()
        replier.close()
    assert sorted(m.body for m in stored(cluster.ns, REPLY_TOPIC)) == [b"answer", b"refused", b"too late"]


def test_replies_are_not_stored_when_disabled(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, config="store_reply_message_enable = false\n")
    requester, replier = JavaWire(c.broker.addr), JavaWire(c.broker.addr)
    try:
        hb = {"clientID": CLIENT, "consumerDataSet": [], "producerDataSet": [{"groupName": "PG_java_req"}]}
        assert requester.call(34, {}, json.dumps(hb).encode())[0]["code"] == 0
        reply_props = props(MSG_TYPE="reply", CORRELATION_ID="c", REPLY_TO_CLIENT=CLIENT, TTL="3000")
        opaque = replier.send(325, send_ext("PG_java_rep", REPLY_TOPIC, reply_props), b"unstored")
        push, body = read_until(requester, lambda h: h["code"] == 326 and not h["flag"] & 1)
        assert body == b"unstored"
        respond(requester, push["opaque"])
        answer, _ = read_until(replier, lambda h: h["flag"] & 1 and h["opaque"] == opaque)
        assert answer["code"] == 0 and answer["extFields"]["msgId"] == "0"  # handlePushReplyResult's zero
        wait_for_route(c.ns, REPLY_TOPIC)
        assert stored(c.ns, REPLY_TOPIC) == []
    finally:
        requester.close()
        replier.close()
        c.stop()
