"""The cap on auto-created topics (``max_auto_created_topics``, broker/topics.py)."""
from __future__ import annotations

import logging

import pytest

from sluice.broker.topics import AUTO_CREATE_TOPIC, TopicConfig, TopicConfigManager
from sluice.errors import TopicNotExistError
from sluice.protocol.codes import RequestCode, ResponseCode


def test_cap_refuses_past_it_logs_once_and_persists(tmp_path, caplog) -> None:
    tm = TopicConfigManager(tmp_path, max_auto_created=3)
    tm.update(TopicConfig("Admin1"))  # admin-created: not counted
    for i in range(3):
        tm.get_or_create_for_send(f"T{i}", AUTO_CREATE_TOPIC, 4)
    tm.create_retry_or_dlq("%RETRY%G")  # retry topics are not counted either
    tm.get_or_create_for_send("%DLQ%G", AUTO_CREATE_TOPIC, 1)
    assert tm.auto_created == {"T0", "T1", "T2"}
    with caplog.at_level(logging.WARNING, logger="sluice.broker.topics"):
        for i in range(5):
            with pytest.raises(TopicNotExistError) as e:
                tm.get_or_create_for_send(f"X{i}", AUTO_CREATE_TOPIC, 4)
            assert f"topic[X{i}] not exist, apply first please!" in str(e.value)
            assert "max_auto_created_topics = 3" in str(e.value)
    assert len([r for r in caplog.records if "max_auto_created_topics" in r.getMessage()]) == 1
    assert tm.refused_by_cap == 5 and tm.get("X0") is None
    assert tm.get_or_create_for_send("T1", AUTO_CREATE_TOPIC, 4).topic_name == "T1"  # existing ones still served
    # The count survives a restart; an admin update adopts a topic, a delete frees its place.
    tm2 = TopicConfigManager(tmp_path, max_auto_created=3)
    assert tm2.auto_created == {"T0", "T1", "T2"}
    with pytest.raises(TopicNotExistError):
        tm2.get_or_create_for_send("X0", AUTO_CREATE_TOPIC, 4)
    tm2.update(TopicConfig("T0"))
    tm2.delete("T1")
    assert tm2.auto_created == {"T2"}
    tm2.get_or_create_for_send("X0", AUTO_CREATE_TOPIC, 4)
    tm2.get_or_create_for_send("X1", AUTO_CREATE_TOPIC, 4)
    with pytest.raises(TopicNotExistError):
        tm2.get_or_create_for_send("X2", AUTO_CREATE_TOPIC, 4)


def test_send_past_the_cap_gets_topic_not_exist_admin_topics_still_work(make_broker) -> None:
    broker = make_broker(max_auto_created_topics=2)
    b = broker.rpc()
    assert b.send("A1").code == ResponseCode.SUCCESS
    assert b.send("A2").code == ResponseCode.SUCCESS
    r = b.send("A3")
    assert r.code == ResponseCode.TOPIC_NOT_EXIST
    assert "topic[A3] not exist, apply first please!" in r.remark and "max_auto_created_topics = 2" in r.remark
    assert broker.broker.topics.get("A3") is None
    # The broker still serves: known topics take sends, and admin-created topics are not capped.
    assert b.send("A1").code == ResponseCode.SUCCESS
    for name in ("Adm1", "Adm2", "Adm3"):
        assert b.call(RequestCode.UPDATE_AND_CREATE_TOPIC,
                      dict(topic=name, readQueueNums=1, writeQueueNums=1, perm=6)).code == ResponseCode.SUCCESS
        assert b.send(name).code == ResponseCode.SUCCESS
    assert broker.broker.topics.auto_created == {"A1", "A2"}
