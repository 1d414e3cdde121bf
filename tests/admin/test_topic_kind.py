"""`sluice admin topicList` kinds: RocketMQ's system topics (TopicValidator.isSystemTopic) are "system"."""
from __future__ import annotations

import pytest

from sluice.admin.topics import topic_kind


@pytest.mark.parametrize("name", ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                                  "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"])
def test_system_topics(name: str) -> None:
    assert topic_kind(name) == "system"


def test_other_kinds() -> None:
    assert (topic_kind("%RETRY%g"), topic_kind("%DLQ%g"), topic_kind("Orders")) == ("retry", "dead-letter", "normal")
