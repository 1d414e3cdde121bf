"""Topic configs and committed offsets: creation rules and persistence across restarts."""
from __future__ import annotations

import json

import pytest

from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.topics import AUTO_CREATE_TOPIC, TopicConfig, TopicConfigManager
from sluice.errors import MessageIllegalError, NoPermissionError, TopicNotExistError


def test_auto_create_takes_requested_queues_capped_by_default(tmp_path):
    tm = TopicConfigManager(tmp_path, auto_create=True, default_queue_nums=8)
    cfg = tm.get_or_create_for_send("Orders", AUTO_CREATE_TOPIC, 4)
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (4, 4, 6)
    assert tm.get_or_create_for_send("Big", AUTO_CREATE_TOPIC, 64).write_queue_nums == 8
    # Persisted: a new manager over the same directory sees it.
    assert TopicConfigManager(tmp_path).get("Orders") == cfg


def test_auto_create_off_names_the_setting(tmp_path):
    tm = TopicConfigManager(tmp_path, auto_create=False)
    with pytest.raises(TopicNotExistError, match="auto_create_topic"):
        tm.get_or_create_for_send("Orders", AUTO_CREATE_TOPIC, 4)


def test_bad_topic_name_refused(tmp_path):
    tm = TopicConfigManager(tmp_path)
    with pytest.raises(MessageIllegalError):
        tm.get_or_create_for_send("bad topic", AUTO_CREATE_TOPIC, 4)
    with pytest.raises(MessageIllegalError):
        tm.update(TopicConfig("a/b"))


def test_permissions(tmp_path):
    tm = TopicConfigManager(tmp_path)
    cfg = tm.update(TopicConfig("RO", perm=4))
    with pytest.raises(NoPermissionError):
        tm.check_writable(cfg)
    tm.check_readable(cfg)


def test_wire_shape_and_version_bumps(tmp_path):
    tm = TopicConfigManager(tmp_path)
    v0 = tm.data_version["counter"]
    tm.update(TopicConfig("T", 2, 3))
    wire = tm.to_wire()
    assert wire["topicConfigTable"]["T"] == {
        "topicName": "T", "readQueueNums": 2, "writeQueueNums": 3, "perm": 6,
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
    assert wire["dataVersion"]["counter"] == v0 + 1


def test_offsets_persist_and_clamp(tmp_path):
    om = ConsumerOffsetManager(tmp_path)
    assert om.query("g", "T", 0) == -1
    om.commit("g", "T", 0, 10)
    om.commit("g", "T", 1, 3)
    om.clamp("T", 1, 5)
    om.persist()
    again = ConsumerOffsetManager(tmp_path)
    assert again.offsets_of("g", "T") == {0: 10, 1: 5}
    assert again.groups_of_topic("T") == {"g"} and again.topics_of_group("g") == {"T"}


def test_offsets_file_is_rocketmq_shaped_with_queue_ids_as_strings(tmp_path):
    """persist() serialises the live table (int queue ids) straight to RocketMQ's consumerOffset.json shape."""
    om = ConsumerOffsetManager(tmp_path)
    om.commit("g", "T", 3, 7)
    om.commit("g", "T", 0, 9)
    om.note_subscribed("g", "T", 1_700_000_000_000)
    om.persist()
    assert json.loads((tmp_path / "consumerOffset.json").read_text()) == {
        "offsetTable": {"T@g": {"3": 7, "0": 9}}, "subscribedAt": {"T@g": 1_700_000_000_000}}
    om.commit("g", "T", 3, 8)  # the table lives on after persisting: the next persist has the change
    om.persist()
    assert ConsumerOffsetManager(tmp_path).offsets_of("g", "T") == {3: 8, 0: 9}
    mtime = (tmp_path / "consumerOffset.json").stat().st_mtime_ns
    om.persist()  # nothing changed: nothing written
    assert (tmp_path / "consumerOffset.json").stat().st_mtime_ns == mtime


def test_damaged_offsets_file_is_set_aside(tmp_path):
    (tmp_path / "consumerOffset.json").write_bytes(b"{not json")
    om = ConsumerOffsetManager(tmp_path)
    assert om.query("g", "T", 0) == -1
    assert (tmp_path / "consumerOffset.json.bad").exists()


def test_trace_topic_enable_creates_the_trace_topic_with_one_queue(tmp_path):
    # TopicConfigManager with traceTopicEnable: msgTraceTopicName, one read and one write queue, kept on restart.
    assert "RMQ_SYS_TRACE_TOPIC" not in TopicConfigManager(tmp_path / "off").to_wire()["topicConfigTable"]
    m = TopicConfigManager(tmp_path / "on", trace_topic="RMQ_SYS_TRACE_TOPIC")
    cfg = m.get("RMQ_SYS_TRACE_TOPIC")
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.readable, cfg.writable) == (1, 1, True, True)
    assert "RMQ_SYS_TRACE_TOPIC" in TopicConfigManager(tmp_path / "on").to_wire()["topicConfigTable"]
