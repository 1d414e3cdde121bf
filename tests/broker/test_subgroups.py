"""Subscription groups (broker/subgroups.py): the table and its file, 200/201/207, and what the broker honours."""
from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
import pytest
from broker_support import bodies, records, sub_data
from hypothesis import given, strategies as st

from sluice.broker.subgroups import FIELDS, SYSTEM_GROUPS, SubscriptionGroupConfig, SubscriptionGroupManager
from sluice.errors import InvalidParameterError, SubscriptionGroupNotExistError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode, ResponseCode as R
from sluice.protocol.msgid import decode_offset_msg_id

ROCKETMQ_DEFAULTS = {"consumeEnable": True, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                     "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
                     "notifyConsumerIdsChangedEnable": True}


# ---- the table ------------------------------------------------------------------------------------------
def test_defaults_and_json_names_are_rocketmqs():
    assert SubscriptionGroupConfig("G").to_wire() == {"groupName": "G", **ROCKETMQ_DEFAULTS}
    assert set(FIELDS.values()) == {"groupName", *ROCKETMQ_DEFAULTS}


def test_file_has_rocketmqs_shape_and_survives_a_reload(tmp_path: Path):
    m = SubscriptionGroupManager(tmp_path)
    assert set(SYSTEM_GROUPS) <= {c.group_name for c in m.all()}
    m.update(SubscriptionGroupConfig("G1", consume_enable=False, retry_max_times=3, retry_queue_nums=2))
    doc = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert set(doc) == {"subscriptionGroupTable", "dataVersion"}
    assert doc["subscriptionGroupTable"]["G1"] == {**ROCKETMQ_DEFAULTS, "groupName": "G1", "consumeEnable": False,
                                                   "retryMaxTimes": 3, "retryQueueNums": 2}
    counter = doc["dataVersion"]["counter"]
    again = SubscriptionGroupManager(tmp_path)
    assert again.get("G1") == m.get("G1") and again.data_version["counter"] == counter
    assert again.delete("G1") and not again.delete("G1")
    assert SubscriptionGroupManager(tmp_path).get("G1") is None


def test_auto_creation(tmp_path: Path):
    m = SubscriptionGroupManager(tmp_path / "on", default_retry_max_times=5)
    assert m.find("Pulled", create=False) == SubscriptionGroupConfig("Pulled", retry_max_times=5)
    assert m.get("Pulled") is None  # a pull's lookup leaves nothing behind
    assert m.find("Beat").retry_max_times == 5 and m.get("Beat") is not None
    m.flush()  # a heartbeat's auto-creation is saved on the saver's thread; the broker's stop flushes it
    assert SubscriptionGroupManager(tmp_path / "on").get("Beat") is not None
    off = SubscriptionGroupManager(tmp_path / "off", auto_create=False)
    assert off.find("Beat") is None and off.get("Beat") is None
    with pytest.raises(SubscriptionGroupNotExistError, match=r"subscription group \[Beat\] does not exist") as info:
        off.require("Beat")
    assert info.value.code == R.SUBSCRIPTION_GROUP_NOT_EXIST
    assert off.find("CID_RMQ_SYS_X") is not None  # system groups are always created (isSysConsumerGroup)


@pytest.mark.parametrize("doc, match", [
    ({"consumeEnable": False}, "needs groupName"),
    ({"groupName": "G", "retryMaxTimes": -1}, "retryMaxTimes must be 0..2147483647"),
    ({"groupName": "G", "retryQueueNums": 2000}, "at most 1024"),
    ({"groupName": "G", "consumeEnable": "yes"}, "consumeEnable must be true or false"),
    ({"groupName": "G", "brokerId": 1.5}, "brokerId must be an integer"),
    ({"groupName": "G", "retryMaxTime": 3}, r"unknown SubscriptionGroupConfig field\(s\) \['retryMaxTime'\]"),
    ({"groupName": "bad group!"}, "characters outside"),
    ({"groupName": "trailing\n"}, "characters outside"),
    ({"groupName": 5}, "groupName must be a string"),
    ({"groupName": ""}, "empty"),
    ([1], "JSON object"),
])
def test_bad_configs_are_refused_precisely(doc, match):
    with pytest.raises(InvalidParameterError, match=match):
        SubscriptionGroupConfig.from_wire(doc)


@given(st.booleans(), st.booleans(), st.integers(0, 1024), st.integers(0, 2**31 - 1), st.integers(0, 16))
def test_wire_round_trip(enable, broadcast, queues, times, broker_id):
    cfg = SubscriptionGroupConfig("G_1", consume_enable=enable, consume_broadcast_enable=broadcast,
                                  retry_queue_nums=queues, retry_max_times=times, broker_id=broker_id)
    assert SubscriptionGroupConfig.from_wire(orjson.loads(orjson.dumps(cfg.to_wire()))) == cfg


def test_string_forms_are_read_as_mqadmin_writes_them():
    cfg = SubscriptionGroupConfig.from_wire({"groupName": "G", "consumeEnable": "false", "retryMaxTimes": "4"})
    assert (cfg.consume_enable, cfg.retry_max_times) == (False, 4)


# ---- the requests -------------------------------------------------------------------------------------
def update(rpc, **fields) -> int:
    return rpc.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, orjson.dumps(fields)).code


def all_groups(rpc) -> dict:
    resp = rpc.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert resp.code == R.SUCCESS
    return orjson.loads(resp.body)


def test_create_list_delete_and_restart(make_broker, tmp_path: Path):
    store = tmp_path / "sg"
    b = make_broker(store)
    rpc = b.rpc()
    assert update(rpc, groupName="GA", retryMaxTimes=2, whichBrokerWhenConsumeSlowly=3) == R.SUCCESS
    doc = all_groups(rpc)
    assert set(doc) == {"subscriptionGroupTable", "dataVersion"}
    assert doc["subscriptionGroupTable"]["GA"] == {**ROCKETMQ_DEFAULTS, "groupName": "GA", "retryMaxTimes": 2,
                                                   "whichBrokerWhenConsumeSlowly": 3}
    bad = rpc.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName": "GA", "retryMaxTimes": -3}')
    assert bad.code == R.INVALID_PARAMETER and "retryMaxTimes" in bad.remark
    assert rpc.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP).code == R.INVALID_PARAMETER  # no body
    assert update(rpc, groupName="GB") == R.SUCCESS
    b.stop()
    b2 = make_broker(store)
    rpc2 = b2.rpc()
    assert {"GA", "GB"} <= set(all_groups(rpc2)["subscriptionGroupTable"])
    b2.broker.offsets.commit("GB", "T", 0, 7)
    gone = rpc2.call(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                     H.DeleteSubscriptionGroupRequestHeader(group_name="GB", remove_offset=True).to_ext())
    assert gone.code == R.SUCCESS and "GB" not in all_groups(rpc2)["subscriptionGroupTable"]
    assert b2.broker.offsets.query("GB", "T", 0) == -1
    assert rpc2.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "GA"}).code == R.SUCCESS
    assert "GA" not in all_groups(rpc2)["subscriptionGroupTable"]


def test_a_disabled_group_gets_no_messages(rpc):
    rpc.send("T", b"m")
    assert update(rpc, groupName="Off", consumeEnable=False) == R.SUCCESS
    refused = rpc.pull("T", group="Off")
    assert refused.code == R.NO_PERMISSION and refused.remark == "subscription group no permission, Off"
    assert bodies(rpc.pull("T", group="On")) == [b"m"]
    assert update(rpc, groupName="Off", consumeEnable=True) == R.SUCCESS
    assert bodies(rpc.pull("T", group="Off")) == [b"m"]


def test_broadcast_refused_when_the_group_forbids_it(rpc):
    rpc.send("T", b"m")
    assert update(rpc, groupName="BC", consumeBroadcastEnable=False) == R.SUCCESS
    beat = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": "BC", "consumeType": "CONSUME_PASSIVELY", "messageModel": "BROADCASTING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [sub_data("T")]}]}
    assert rpc.call(RequestCode.HEART_BEAT, {}, orjson.dumps(beat)).code == R.SUCCESS
    refused = rpc.pull("T", group="BC")
    assert refused.code == R.NO_PERMISSION and "can not consume by broadcast way" in refused.remark
    assert update(rpc, groupName="BC") == R.SUCCESS  # back to the defaults
    assert bodies(rpc.pull("T", group="BC")) == [b"m"]


def test_heartbeat_creates_the_group_and_its_retry_queues_a_pull_does_not(rpc, broker):
    rpc.send("T", b"m")
    assert bodies(rpc.pull("T", group="Quiet")) == [b"m"]
    assert broker.broker.subgroups.get("Quiet") is None
    assert update(rpc, groupName="Wide", retryQueueNums=3) == R.SUCCESS
    assert rpc.heartbeat("c1", "Wide", [sub_data("T")]).code == R.SUCCESS
    assert broker.broker.topics.get("%RETRY%Wide").write_queue_nums == 3
    assert rpc.heartbeat("c1", "Fresh", [sub_data("T")]).code == R.SUCCESS
    assert broker.broker.subgroups.get("Fresh") == SubscriptionGroupConfig("Fresh")


def test_auto_creation_off(make_broker):
    b = make_broker(auto_create_subscription_group=False)
    rpc = b.rpc()
    rpc.send("T", b"m")
    assert rpc.heartbeat("c1", "New", [sub_data("T")]).code == R.SUCCESS  # registers, as RocketMQ's heartBeat
    assert b.broker.subgroups.get("New") is None and b.broker.topics.get("%RETRY%New") is None
    refused = rpc.pull("T", group="New")
    assert refused.code == R.SUBSCRIPTION_GROUP_NOT_EXIST and "subscription group [New] does not exist" in refused.remark
    assert update(rpc, groupName="New") == R.SUCCESS
    assert bodies(rpc.pull("T", group="New")) == [b"m"]


def send_back(rpc, offset: int, group: str, **extra) -> int:
    h = H.ConsumerSendMsgBackRequestHeader(offset=offset, group=group, delay_level=0, origin_topic="T", **extra)
    return rpc.call(RequestCode.CONSUMER_SEND_MSG_BACK, h.to_ext()).code


def test_retry_max_times_decides_the_dead_letter(rpc, broker):
    ack = rpc.send("T", b"twice", reconsume_times=2)
    offset = decode_offset_msg_id(ack.ext_fields["msgId"]).offset
    assert update(rpc, groupName="Strict", retryMaxTimes=2) == R.SUCCESS
    assert send_back(rpc, offset, "Strict") == R.SUCCESS  # consumed twice already: dead
    assert bodies(rpc.pull("%DLQ%Strict")) == [b"twice"]
    assert update(rpc, groupName="Patient", retryMaxTimes=3) == R.SUCCESS
    assert send_back(rpc, offset, "Patient") == R.SUCCESS
    assert broker.broker.topics.get("%DLQ%Patient") is None
    [sched] = [r for q in range(18) for r in records(rpc.pull("SCHEDULE_TOPIC_XXXX", queue_id=q))]
    assert sched.body == b"twice" and sched.reconsume_times == 3
    # A limit the client names wins, as RocketMQ takes it from clients since 3.4.9.
    assert send_back(rpc, offset, "Strict2", max_reconsume_times=5) == R.SUCCESS
    assert broker.broker.topics.get("%DLQ%Strict2") is None
    # retryQueueNums 0: no retries; the message is kept as a dead letter (RocketMQ would drop it).
    assert update(rpc, groupName="NoRetry", retryQueueNums=0) == R.SUCCESS
    assert send_back(rpc, offset, "NoRetry") == R.SUCCESS
    assert bodies(rpc.pull("%DLQ%NoRetry")) == [b"twice"]


def test_a_send_to_a_retry_topic_takes_the_groups_limit(rpc, broker):
    assert update(rpc, groupName="grp", retryMaxTimes=1) == R.SUCCESS
    assert rpc.send("%RETRY%grp", b"again", reconsume_times=2).code == R.SUCCESS
    assert bodies(rpc.pull("%DLQ%grp")) == [b"again"]
    assert rpc.send("%RETRY%grp", b"retry", reconsume_times=1).code == R.SUCCESS
    assert bodies(rpc.pull("%RETRY%grp")) == [b"retry"]


def test_send_back_of_an_unknown_group_with_auto_creation_off(make_broker):
    b = make_broker(auto_create_subscription_group=False)
    rpc = b.rpc()
    offset = decode_offset_msg_id(rpc.send("T", b"m").ext_fields["msgId"]).offset
    assert send_back(rpc, offset, "Nobody") == R.SUBSCRIPTION_GROUP_NOT_EXIST


def test_no_rebalance_notice_when_the_group_turns_it_off(rpc, broker):
    sent: list[str] = []
    real = broker.broker._notify

    async def spy(conn, req):
        sent.append(req.ext_fields["consumerGroup"])
        await real(conn, req)
    broker.broker._notify = spy  # type: ignore[method-assign]
    assert update(rpc, groupName="Quiet", notifyConsumerIdsChangedEnable=False) == R.SUCCESS
    for group in ("Quiet", "Loud"):
        assert rpc.heartbeat("c1", group, [sub_data("T")]).code == R.SUCCESS
        assert rpc.heartbeat("c2", group, [sub_data("T")]).code == R.SUCCESS
    deadline = time.monotonic() + 5
    while "Loud" not in sent and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "Loud" in sent and "Quiet" not in sent
