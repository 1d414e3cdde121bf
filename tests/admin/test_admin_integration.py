"""``sluice admin`` against real ``sluice namesrv`` + two ``sluice broker`` subprocesses (in-process CLI runs).

The module shares one cluster; each test uses its own topics and groups. The last test kills broker-b.
"""
from __future__ import annotations

import asyncio
import base64
import signal
import time
from pathlib import Path

import pytest
from admin_support import (Cluster, Run, cluster, join_group, run_admin, send_back_to_dlq, topic,  # noqa: F401
                           wait_for, wait_for_route, write_dead_letter)

from sluice import Message, Producer, PullConsumer, PullStatus
from sluice.admin import ExitStatus
from sluice.protocol.bodies import ConsumerData, HeartbeatData, MessageQueue, SubscriptionData, encode_body
from sluice.transport.client import RemotingClient
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection
from sluice.protocol.headers import ResetOffsetRequestHeader
from sluice.protocol.offset_table import decode_offset_table

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def make_topic(c: Cluster, name: str, queues: int = 2) -> None:
    r = c.admin("updateTopic", "-t", name, "-c", "DefaultCluster", "-r", str(queues), "-w", str(queues))
    assert r.status is ExitStatus.SUCCESS, r.stderr
    wait_for_route(c.ns, name, brokers=2)


def send(c: Cluster, topic_: str, n: int, **kw: object) -> list:
    with Producer("admin-test-producer", namesrv=c.ns) as p:
        results = [p.send(Message(topic_, f"m{i}".encode(), **kw)) for i in range(n)]  # type: ignore[arg-type]
    wait_dispatched(c, topic_, [(r.queue.broker_name, r.queue.queue_id, r.queue_offset) for r in results])
    return results


def wait_dispatched(c: Cluster, topic_: str, stored: list[tuple[str, int, int]]) -> None:
    """A send is acknowledged before dispatch makes it visible: wait until every (broker, queue, offset) shows."""
    want: dict[tuple[str, int], int] = {}
    for broker, qid, offset in stored:
        want[(broker, qid)] = max(want.get((broker, qid), 0), offset + 1)

    def visible() -> bool:
        got = {(e["brokerName"], e["queueId"]): e["maxOffset"]
               for e in c.admin("topicStatus", "-t", topic_, "--json").json["offsetTable"]}
        return all(got.get(k, 0) >= v for k, v in want.items())
    wait_for(visible, 10, f"dispatch of {len(stored)} message(s) of {topic_}")


def pull_all(c: Cluster, topic_: str, group: str) -> list:
    out = []
    with PullConsumer(group, namesrv=c.ns) as pc:
        for mq in pc.fetch_message_queues(topic_):
            off = 0
            while True:
                r = pc.pull(mq, "*", off, 32)
                if r.status is not PullStatus.FOUND:
                    break
                out += r.msg_found_list
                off = r.next_begin_offset
    return out


# ------------------------------------------------------------------------------------------ cluster / topics

def test_cluster_list_and_broker_status(cluster: Cluster) -> None:
    r = cluster.admin("clusterList")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    assert "broker-a" in r.stdout and "broker-b" in r.stdout and "Sluice" in r.stdout
    data = cluster.admin("cluster-list", "--json").json
    assert sorted(b["brokerName"] for b in data["brokers"]) == ["broker-a", "broker-b"]
    assert all(b["reachable"] and b["cluster"] == "DefaultCluster" for b in data["brokers"])
    addr_a = cluster.brokers[0].addr
    st = cluster.admin("brokerStatus", "-b", addr_a, "--json")
    assert st.status is ExitStatus.SUCCESS and st.json["brokerName"] == "broker-a"
    both = cluster.admin("brokerStatus", "-c", "DefaultCluster", "--json").json
    assert set(both) == {b.addr for b in cluster.brokers}
    assert cluster.admin("clusterList", "-c", "NoSuchCluster").status is ExitStatus.NOT_FOUND
    assert cluster.admin("brokerStatus", "-b", "127.0.0.1:1").status is ExitStatus.UNAVAILABLE


def test_update_topic_list_route_status(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic, queues=3)
    listed = {e["topic"]: e for e in cluster.admin("topicList", "--json").json["topics"]}
    assert listed[topic]["kind"] == "normal" and listed["TBW102"]["kind"] == "system"
    with_cluster = {e["topic"]: e for e in cluster.admin("topicList", "-c", "--json").json["topics"]}
    assert with_cluster[topic]["clusters"] == ["DefaultCluster"]
    route = cluster.admin("topicRoute", "-t", topic, "--json").json
    assert sorted((q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]) \
        == [("broker-a", 3, 3, 6), ("broker-b", 3, 3, 6)]
    send(cluster, topic, 12)
    st = cluster.admin("topicStatus", "-t", topic, "--json").json
    assert len(st["offsetTable"]) == 6
    assert sum(e["maxOffset"] - e["minOffset"] for e in st["offsetTable"]) == 12
    assert all(e["lastUpdateTimestamp"] > 0 for e in st["offsetTable"] if e["maxOffset"] > 0)
    text = cluster.admin("topicStatus", "-t", topic)
    assert "12 message(s) kept" in text.stdout
    # Change the queues on one broker only.
    r = cluster.admin("updateTopic", "-t", topic, "-b", cluster.brokers[1].addr, "-r", "1", "-w", "1", "-p", "4")
    assert r.status is ExitStatus.SUCCESS, r.stderr

    def changed() -> bool:
        q = {d["brokerName"]: d for d in cluster.admin("topicRoute", "-t", topic, "--json").json["queueDatas"]}
        return q["broker-b"]["writeQueueNums"] == 1 and q["broker-b"]["perm"] == 4 and q["broker-a"]["perm"] == 6
    wait_for(changed, 10, "route change of broker-b")


def test_ordered_topic_publishes_its_queue_layout(cluster: Cluster, topic: str) -> None:
    r = cluster.admin("updateTopic", "-t", topic, "-c", "DefaultCluster", "-w", "4", "-r", "4", "-o", "true", "--json")
    assert r.status is ExitStatus.SUCCESS and r.json["orderConf"] == "broker-a:4;broker-b:4"
    wait_for_route(cluster.ns, topic, brokers=2)
    assert cluster.admin("topicRoute", "-t", topic, "--json").json["orderTopicConf"] == "broker-a:4;broker-b:4"


def test_unknown_topic_is_not_found(cluster: Cluster) -> None:
    for argv in (["topicRoute", "-t", "NoSuchTopic"], ["topicStatus", "-t", "NoSuchTopic"],
                 ["consumeMessage", "-t", "NoSuchTopic"]):
        r = cluster.admin(*argv)
        assert r.status is ExitStatus.NOT_FOUND, (argv, r.stderr)
        assert "NoSuchTopic" in r.stderr


def test_delete_topic(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    r = cluster.admin("deleteTopic", "-t", topic, "-c", "DefaultCluster")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    assert cluster.admin("topicRoute", "-t", topic).status is ExitStatus.NOT_FOUND
    assert topic not in {e["topic"] for e in cluster.admin("topicList", "--json").json["topics"]}


def test_update_and_delete_sub_group(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic, queues=1)
    send(cluster, topic, 2)
    group = f"CG_sub_{topic[-8:]}"
    r = cluster.admin("updateSubGroup", "-c", "DefaultCluster", "-g", group, "-s", "false", "-r", "3", "-q", "2",
                      "-w", "0", "-a", "false", "--json")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    assert r.json["config"] == {"groupName": group, "consumeEnable": False, "consumeFromMinEnable": True,
                                "consumeBroadcastEnable": True, "retryQueueNums": 2, "retryMaxTimes": 3,
                                "brokerId": 0, "whichBrokerWhenConsumeSlowly": 0,
                                "notifyConsumerIdsChangedEnable": False}
    assert sorted(b["brokerName"] for b in r.json["brokers"]) == ["broker-a", "broker-b"]
    queues = []
    with PullConsumer(group, namesrv=cluster.ns) as c:
        queues = c.fetch_message_queues(topic)
        with pytest.raises(Exception, match="subscription group no permission") as info:
            c.pull(queues[0], "*", 0)
        assert info.value.code == 16  # NO_PERMISSION
        # back on, on one broker: its queues deliver again
        addr = next(b["addr"] for b in r.json["brokers"] if b["brokerName"] == queues[0].broker_name)
        assert cluster.admin("updateSubGroup", "-b", addr, "-g", group).status is ExitStatus.SUCCESS
        assert c.pull(queues[0], "*", 0).status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
    bad = cluster.admin("updateSubGroup", "-c", "DefaultCluster", "-g", group, "-q", "2000")
    assert bad.status is ExitStatus.USAGE
    assert cluster.admin("updateSubGroup", "-g", group).status is ExitStatus.USAGE  # neither -b nor -c
    d = cluster.admin("deleteSubGroup", "-c", "DefaultCluster", "-g", group, "--json")
    assert d.status is ExitStatus.SUCCESS and sorted(d.json["brokers"]) == ["broker-a", "broker-b"]


# ------------------------------------------------------------------------------------------ messages

def test_send_and_query_by_key_id_and_unique_key(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    r = cluster.admin("sendMessage", "-t", topic, "-p", "hello ü", "-k", "order-7 shared", "-c", "TagA",
                      "-P", "region=eu", "-P", "amount=42", "-b", "broker-b", "-i", "1", "--json")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    sent = r.json
    assert sent["status"] == "SEND_OK" and sent["brokerName"] == "broker-b" and sent["queueId"] == 1
    other = send(cluster, topic, 1, keys=["shared"])[0]
    wait_dispatched(cluster, topic, [("broker-b", 1, sent["queueOffset"])])

    by_key = cluster.admin("queryMsgByKey", "-t", topic, "-k", "shared", "--json").json["messages"]
    assert sorted(m["msgId"] for m in by_key) == sorted([sent["msgId"], other.msg_id])
    only = cluster.admin("queryMsgByKey", "-t", topic, "-k", "order-7", "--json").json["messages"]
    assert [m["msgId"] for m in only] == [sent["msgId"]]
    m = only[0]
    assert m["body"] == "hello ü" and m["tags"] == "TagA" and m["keys"] == ["order-7", "shared"]
    assert m["properties"]["region"] == "eu" and m["properties"]["amount"] == "42" and m["role"] == "original"
    assert cluster.admin("queryMsgByKey", "-t", topic, "-k", "shared", "-c", "1", "--json").json["messages"].__len__() == 1

    by_id = cluster.admin("queryMsgById", "-i", sent["offsetMsgId"], "--json").json["messages"]
    assert [x["msgId"] for x in by_id] == [sent["msgId"]]
    both = cluster.admin("queryMsgById", "-i", f"{sent['offsetMsgId']},{other.offset_msg_id}", "--json")
    assert [x["offsetMsgId"] for x in both.json["messages"]] == [sent["offsetMsgId"], other.offset_msg_id]
    text = cluster.admin("queryMsgById", "-i", sent["offsetMsgId"]).stdout
    assert "Offset Msg ID" in text and "hello ü" in text and "region=eu" in text

    by_uniq = cluster.admin("queryMsgByUniqueKey", "-t", topic, "-i", sent["msgId"], "--json").json["messages"]
    assert [x["offsetMsgId"] for x in by_uniq] == [sent["offsetMsgId"]]

    # The classic mix-up, in both directions: a clear not-found with the right command to use.
    mixed = cluster.admin("queryMsgById", "-i", sent["msgId"])
    assert mixed.status is ExitStatus.NOT_FOUND and "queryMsgByUniqueKey" in mixed.stderr
    fallback = cluster.admin("queryMsgById", "-i", sent["msgId"], "-t", topic, "--json")
    assert fallback.status is ExitStatus.SUCCESS and fallback.json["messages"][0]["msgId"] == sent["msgId"]
    mixed = cluster.admin("queryMsgByUniqueKey", "-t", topic, "-i", sent["offsetMsgId"])
    assert mixed.status is ExitStatus.NOT_FOUND and "queryMsgById" in mixed.stderr

    nothing = cluster.admin("queryMsgByKey", "-t", topic, "-k", "no-such-key", "--json")
    assert nothing.status is ExitStatus.NOT_FOUND and nothing.stdout == "" and nothing.error["status"] == "NOT_FOUND"
    future = cluster.admin("queryMsgByKey", "-t", topic, "-k", "shared", "-b", str(int(time.time() * 1000) + 3_600_000))
    assert future.status is ExitStatus.NOT_FOUND and "time range" in future.stderr


def test_send_message_bodies_from_files_and_stdin(cluster: Cluster, topic: str, tmp_path: Path) -> None:
    make_topic(cluster, topic)
    f = tmp_path / "body.bin"
    f.write_bytes(bytes(range(256)) * 40)  # binary, and big enough to be sent compressed
    r = cluster.admin("sendMessage", "-t", topic, "--body-file", str(f), "-k", "file-body", "--json")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    piped = run_admin("sendMessage", "-t", topic, "--body-file", "-", "-k", "stdin-body", "-n", cluster.ns, "--json",
                      stdin=b"from stdin")
    assert piped.status is ExitStatus.SUCCESS, piped.stderr
    wait_dispatched(cluster, topic, [(x["brokerName"], x["queueId"], x["queueOffset"]) for x in (r.json, piped.json)])
    m = cluster.admin("queryMsgByKey", "-t", topic, "-k", "file-body", "--json").json["messages"][0]
    assert cluster.admin("queryMsgByKey", "-t", topic, "-k", "stdin-body", "--json").json["messages"][0]["body"] \
        == "from stdin"
    assert m["bodyEncoding"] == "base64" and base64.b64decode(m["body"]) == f.read_bytes()
    missing = cluster.admin("sendMessage", "-t", topic, "--body-file", str(tmp_path / "nope"))
    assert missing.status is ExitStatus.USAGE and "does not exist" in missing.stderr


def test_send_message_refusals(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    r = cluster.admin("sendMessage", "-t", topic, "-p", "x", "-P", "TAGS=sneaky")
    assert r.status is ExitStatus.REFUSED and "reserved" in r.stderr
    r = cluster.admin("sendMessage", "-t", topic, "-p", "")
    assert r.status is ExitStatus.REFUSED and "empty" in r.stderr


def test_consume_message_filters_and_bounds_without_committing(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic, queues=1)
    with Producer("admin-test-producer", namesrv=cluster.ns) as p:
        q = MessageQueue(topic=topic, broker_name="broker-a", queue_id=0)
        for i in range(10):
            last = p.send(Message(topic, f"b{i}".encode(), tags="even" if i % 2 == 0 else "odd",
                                  properties={"n": str(i)}), queue=q)
    wait_dispatched(cluster, topic, [("broker-a", 0, last.queue_offset)])
    everything = cluster.admin("consumeMessage", "-t", topic, "--json").json["messages"]
    assert [m["body"] for m in everything] == [f"b{i}" for i in range(10)]
    odd = cluster.admin("consumeMessage", "-t", topic, "--tags", "odd", "--json").json["messages"]
    assert [m["body"] for m in odd] == ["b1", "b3", "b5", "b7", "b9"]
    sql = cluster.admin("consume-message", "-t", topic, "--sql", "n >= 7", "--json").json["messages"]
    assert [m["body"] for m in sql] == ["b7", "b8", "b9"]
    window = cluster.admin("consumeMessage", "-t", topic, "-b", "broker-a", "-i", "0", "-o", "4", "-c", "3", "--json")
    assert [m["body"] for m in window.json["messages"]] == ["b4", "b5", "b6"]
    text = cluster.admin("consumeMessage", "-t", topic, "-c", "2")
    assert "2 message(s)" in text.stdout and "b1" in text.stdout
    # Nothing was committed for the tools group.
    tools = cluster.admin("consumerProgress", "-g", "TOOLS_CONSUMER", "-t", topic, "--json").json["offsetTable"]
    assert tools and all(e["consumerOffset"] == -1 for e in tools)


# ------------------------------------------------------------------------------------------ consumer groups

def test_consumer_progress_and_connection(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    send(cluster, topic, 8)
    group = f"G_{topic}"
    with PullConsumer(group, namesrv=cluster.ns) as pc:
        queues = pc.fetch_message_queues(topic)
        consumed = 0
        for mq in queues[:2]:  # consume two of the four queues completely
            r = pc.pull(mq, "*", 0, 32)
            consumed += len(r.msg_found_list)
            pc.update_consumer_offset(mq, r.next_begin_offset)
        pc.commit()
        prog = cluster.admin("consumerProgress", "-g", group, "-t", topic, "--json")
        assert prog.status is ExitStatus.SUCCESS, prog.stderr
        data = prog.json
        assert data["totalLag"] == 8 - consumed and len(data["offsetTable"]) == 4
        for e in data["offsetTable"]:
            assert e["matchingLagBasis"] in ("counted", "at-least", "plain-lag")
            assert e["matchingLag"] <= e["lag"]
        # Without -t a broker reports the topics the group committed on or subscribes to: broker-b has
        # neither (both consumed queues are broker-a's and the heartbeat came before any pull).
        text = cluster.admin("consumer-progress", "-g", group).stdout
        assert "Matching Lag" in text and "broker-a" in text and "broker-b" not in text
        assert f"group {group}: total lag 0" in text
        groups = {g["group"]: g for g in cluster.admin("consumerProgress", "--json").json["groups"]}
        assert groups[group]["clients"] == 1 and groups[group]["totalLag"] == 0
    gone = cluster.admin("consumerConnection", "-g", group)
    assert gone.status is ExitStatus.NOT_FOUND and "not online" in gone.stderr
    assert cluster.admin("consumerProgress", "-g", "NoSuchGroup").status is ExitStatus.NOT_FOUND


def test_consumer_progress_counts_the_matching_lag_of_a_tag_subscription(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic, queues=1)
    group = f"G_{topic}"
    with Producer("admin-test-producer", namesrv=cluster.ns) as p:
        q = MessageQueue(topic=topic, broker_name="broker-a", queue_id=0)
        for i in range(6):
            last = p.send(Message(topic, b"x", tags="TagA" if i < 2 else "TagB"), queue=q)
    wait_dispatched(cluster, topic, [("broker-a", 0, last.queue_offset)])

    async def scenario() -> tuple[Run, Run]:
        client = RemotingClient()
        try:
            await join_group(client, [cluster.brokers[0].addr], group, topic, "member-1", "TagA")
            loop = asyncio.get_running_loop()
            as_json = await loop.run_in_executor(None, cluster.admin, "consumerProgress", "-g", group, "-t", topic,
                                                 "--json")
            text = await loop.run_in_executor(None, cluster.admin, "consumerProgress", "-g", group, "-t", topic)
            return as_json, text
        finally:
            await client.close()

    as_json, text = asyncio.run(scenario())
    assert as_json.status is ExitStatus.SUCCESS, as_json.stderr
    (a_row,) = [e for e in as_json.json["offsetTable"] if e["brokerName"] == "broker-a"]
    if a_row["matchingLagBasis"] == "plain-lag":
        pytest.skip("this broker does not count the filter-aware lag")
    assert (a_row["lag"], a_row["matchingLag"], a_row["matchingLagBasis"]) == (6, 2, "counted")
    assert as_json.json["totalMatchingLag"] == 2
    assert "matching lag 2," in text.stdout


def test_consumer_connection_merges_brokers(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    group = f"G_{topic}"

    async def scenario() -> tuple[Run, Run]:
        client = RemotingClient()
        try:
            addrs = [b.addr for b in cluster.brokers]
            await join_group(client, addrs, group, topic, "member-1", "TagA || TagB")
            loop = asyncio.get_running_loop()
            as_json = await loop.run_in_executor(None, cluster.admin, "consumerConnection", "-g", group, "--json")
            text = await loop.run_in_executor(None, cluster.admin, "consumer-connection", "-g", group)
            return as_json, text
        finally:
            await client.close()

    conn, text = asyncio.run(scenario())
    assert conn.status is ExitStatus.SUCCESS, conn.stderr
    assert [c["clientId"] for c in conn.json["connectionSet"]] == ["member-1"]  # one client, seen on two brokers
    assert conn.json["subscriptionTable"][topic]["subString"] == "TagA || TagB"
    assert "Subscriptions" in text.stdout and "TagA || TagB" in text.stdout and "member-1" in text.stdout
    wait_for(lambda: cluster.admin("consumerConnection", "-g", group).status is ExitStatus.NOT_FOUND, 10,
             "the group to go offline when its connection closed")


def test_reset_offset_by_time_offline_group_back_and_forth(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    send(cluster, topic, 8)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    send(cluster, topic, 8)
    group = f"G_{topic}"  # never consumed: the reset positions a brand-new, offline group

    r = cluster.admin("resetOffsetByTime", "-g", group, "-t", topic, "-s", str(middle), "--json")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    table_ = r.json["offsetTable"]
    assert len(table_) == 4 and all(e["previousOffset"] == -1 for e in table_) and r.json["notifiedClients"] == []
    prog = cluster.admin("consumerProgress", "-g", group, "-t", topic, "--json").json
    assert prog["totalLag"] == 8  # exactly the second batch is left

    latest = cluster.admin("reset-offset-by-time", "-g", group, "-t", topic, "-s", "latest", "--json").json
    assert cluster.admin("consumerProgress", "-g", group, "-t", topic, "--json").json["totalLag"] == 0
    assert all(e["offset"] >= e["previousOffset"] for e in latest["offsetTable"])
    # Not forced: a move forward is refused per queue, a move back happens.
    cluster.admin("resetOffsetByTime", "-g", group, "-t", topic, "-s", "earliest", "-f", "false")
    assert cluster.admin("consumerProgress", "-g", group, "-t", topic, "--json").json["totalLag"] == 16
    kept = cluster.admin("resetOffsetByTime", "-g", group, "-t", topic, "-s", "latest", "-f", "false", "--json").json
    assert all(e["offset"] == e["previousOffset"] == 0 for e in kept["offsetTable"])
    # One queue, an explicit offset (clamped to the queue's end).
    one = cluster.admin("resetOffsetByTime", "-g", group, "-t", topic, "-b", "broker-a", "-q", "1", "-o", "1000",
                        "--json").json["offsetTable"]
    assert [(e["brokerName"], e["queueId"]) for e in one] == [("broker-a", 1)]
    assert one[0]["offset"] > 0 and one[0]["previousOffset"] == 0
    text = cluster.admin("resetOffsetByTime", "-g", group, "-t", topic, "-s", "now").stdout
    assert "New Offset" in text and "no client online" in text
    bad = cluster.admin("resetOffsetByTime", "-g", group, "-t", topic, "-q", "9", "-o", "0")
    assert bad.status is ExitStatus.REFUSED and "not 9" in bad.stderr


def test_reset_notifies_online_clients_with_reset_consumer_client_offset(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    send(cluster, topic, 4)
    group = f"G_{topic}"
    addr = cluster.brokers[0].addr

    async def scenario() -> tuple[RemotingCommand, object]:
        got: asyncio.Queue[RemotingCommand] = asyncio.Queue()

        async def on_reset(conn: RemotingConnection, req: RemotingCommand) -> None:
            await got.put(req)

        client = RemotingClient()
        client.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, on_reset)
        try:
            hb = HeartbeatData(client_id="admin-test@1", consumer_data_set=[ConsumerData(
                group_name=group, subscription_data_set=[SubscriptionData(topic=topic)])])
            await client.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(hb)), 5)
            loop = asyncio.get_running_loop()
            run = await loop.run_in_executor(None, lambda: cluster.admin(
                "resetOffsetByTime", "-g", group, "-t", topic, "-s", "earliest", "-b", "broker-a", "--json"))
            return await asyncio.wait_for(got.get(), 10), run
        finally:
            await client.close()

    req, run = asyncio.run(scenario())
    assert run.status is ExitStatus.SUCCESS and run.json["notifiedClients"] == ["admin-test@1"]  # type: ignore[attr-defined]
    h = ResetOffsetRequestHeader.from_command(req)
    assert (h.topic, h.group, h.timestamp, h.is_force) == (topic, group, 0, True)
    offsets = decode_offset_table(req.body)  # RocketMQ's fastjson form, as Java clients decode it
    assert sorted(mq.queue_id for mq in offsets) == [0, 1] and set(offsets.values()) == {0}


# ------------------------------------------------------------------------------------------ dead letters

def test_resend_dead_letters(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    group = f"G_{topic}"
    addr = cluster.brokers[0].addr
    u1 = write_dead_letter(addr, group, b"dead one", origin=topic, tags="TagA", keys="k1 k2", props={"region": "eu"})
    u2 = write_dead_letter(addr, group, "dead two ü".encode(), origin=topic, via_retry=False)
    u3 = write_dead_letter(addr, group, b"orphan", origin=None)
    wait_for_route(cluster.ns, f"%DLQ%{group}")
    wait_dispatched(cluster, f"%DLQ%{group}", [("broker-a", 0, 2)])

    dry = cluster.admin("resendDeadLetters", "-g", group, "--dry-run", "--json")
    assert dry.status is ExitStatus.PARTIAL  # the orphan names no topic
    assert [(m["msgId"], m["result"]) for m in dry.json["messages"]] == \
        [(u1, "would resend"), (u2, "would resend"), (u3, "skipped")]
    assert pull_all(cluster, topic, f"{group}_check0") == []

    first = cluster.admin("dlqResend", "-g", group, "--max", "1", "--json")
    assert first.status is ExitStatus.SUCCESS and first.json["resent"] == 1
    rest = cluster.admin("resend-dead-letters", "-g", group)
    assert rest.status is ExitStatus.PARTIAL and "resent 1, skipped 1" in rest.stdout
    assert "it names no original topic" in rest.stderr

    def two_back() -> list:
        got = pull_all(cluster, topic, f"{group}_check1")
        return got if len(got) == 2 else []
    back = {m.msg_id: m for m in wait_for(two_back, 10, "resent letters")}
    assert set(back) == {u1, u2}  # the msgIds are kept
    m1 = back[u1]
    assert (m1.body, m1.tags, m1.keys, m1.properties.get("region")) == (b"dead one", "TagA", ["k1", "k2"], "eu")
    assert m1.reconsume_times == 0 and "RETRY_TOPIC" not in m1.properties and "DLQ_ORIGIN_TOPIC" not in m1.properties
    assert back[u2].body == "dead two ü".encode()

    # Progress is the group's offset on the DLQ: nothing is resent twice, and consumerProgress shows it.
    again = cluster.admin("resendDeadLetters", "-g", group, "--json").json
    assert again["resent"] == 0 and again["messages"] == []
    dlq_rows = [e for e in cluster.admin("consumerProgress", "-g", group, "--json").json["offsetTable"]
                if e["topic"] == f"%DLQ%{group}"]
    assert [(e["consumerOffset"], e["lag"]) for e in dlq_rows] == [(3, 0)]
    # --all starts over; -i picks one letter and leaves offsets alone.
    picked = cluster.admin("resendDeadLetters", "-g", group, "--all", "-i", u2, "--json").json
    assert [m["msgId"] for m in picked["messages"]] == [u2] and picked["offsets"][0]["committed"] is False
    wait_for(lambda: len(pull_all(cluster, topic, f"{group}_check2")) == 3, 10, "the third copy")
    unknown = cluster.admin("resendDeadLetters", "-g", group, "--all", "-i", "0" * 32)
    assert unknown.status is ExitStatus.NOT_FOUND and "holds none of" in unknown.stderr
    half = cluster.admin("resendDeadLetters", "-g", group, "--all", "-i", u1, "-i", "0" * 32, "--dry-run")
    assert half.status is ExitStatus.PARTIAL and "does not hold" in half.stderr and "would resend 1" in half.stdout
    # queryMsgByUniqueKey with -g shows every copy, labelled.
    copies = cluster.admin("queryMsgByUniqueKey", "-t", topic, "-i", u2, "-g", group, "--json").json["messages"]
    assert sorted(c["role"] for c in copies) == ["dead-letter", "original", "original"]


def test_resend_letters_the_broker_dead_lettered(cluster: Cluster, topic: str) -> None:
    """The real path: a consumer gives up on a message (CONSUMER_SEND_MSG_BACK, level -1), the broker's
    retry service stores the dead letter, the tool sends it back."""
    make_topic(cluster, topic, queues=1)
    group = f"G_{topic}"
    with Producer("admin-test-producer", namesrv=cluster.ns) as p:
        sent = p.send(Message(topic, b"poison", tags="T1", keys=["pk"], properties={"a": "1"}),
                      queue=MessageQueue(topic=topic, broker_name="broker-a", queue_id=0))
    wait_dispatched(cluster, topic, [("broker-a", 0, sent.queue_offset)])
    stored = pull_all(cluster, topic, f"{group}_first")[0]
    if not send_back_to_dlq(cluster.brokers[0].addr, group, stored.commitlog_offset, topic, sent.msg_id):
        pytest.skip("this broker does not serve CONSUMER_SEND_MSG_BACK")
    wait_for_route(cluster.ns, f"%DLQ%{group}")
    wait_dispatched(cluster, f"%DLQ%{group}", [("broker-a", 0, 0)])
    r = cluster.admin("resendDeadLetters", "-g", group, "--json")
    assert r.status is ExitStatus.SUCCESS, r.stderr
    assert [(m["msgId"], m["originTopic"], m["result"]) for m in r.json["messages"]] == [(sent.msg_id, topic, "resent")]

    def twice() -> list:
        got = pull_all(cluster, topic, f"{group}_second")
        return got if len(got) == 2 else []
    again = [m for m in wait_for(twice, 10, "the resent copy") if m.queue_offset == 1][0]
    assert (again.msg_id, again.body, again.tags, again.keys, again.properties["a"]) == \
        (sent.msg_id, b"poison", "T1", ["pk"], "1")
    assert not {"DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID"} & set(again.properties)


def test_resend_without_dead_letter_topic_is_not_found(cluster: Cluster) -> None:
    r = cluster.admin("resendDeadLetters", "-g", "NeverFailed")
    assert r.status is ExitStatus.NOT_FOUND and "%DLQ%NeverFailed" in r.stderr


# ------------------------------------------------------------------------------------------ partial failures (last)

def test_an_unresponsive_broker_makes_multi_broker_commands_partial(cluster: Cluster, topic: str) -> None:
    make_topic(cluster, topic)
    frozen = cluster.brokers[1]
    frozen.signal(signal.SIGSTOP)  # registered, connected, silent: every request to it times out
    try:
        r = cluster.admin("clusterList", "--timeout", "0.5")
        assert r.status is ExitStatus.PARTIAL and "UNREACHABLE" in r.stdout and "broker-b" in r.stderr
        r = cluster.admin("topicStatus", "-t", topic, "--timeout", "0.5", "--json")
        assert r.status is ExitStatus.PARTIAL and {e["brokerName"] for e in r.json["offsetTable"]} == {"broker-a"}
        r = cluster.admin("updateTopic", "-t", topic, "-c", "DefaultCluster", "--timeout", "0.5")
        assert r.status is ExitStatus.PARTIAL and "FAILED" in r.stdout
        r = cluster.admin("brokerStatus", "-b", frozen.addr, "--timeout", "0.5")
        assert r.status is ExitStatus.UNAVAILABLE and "no response" in r.stderr
    finally:
        frozen.kill()  # SIGKILL ends a stopped process too; the fixture's stop() is then a no-op
