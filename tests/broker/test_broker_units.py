"""Unit tests of the broker's pieces that need no server: consumer manager, filters, status mapping."""
from __future__ import annotations

import numpy as np
import pytest

from sluice.broker.consumers import ConsumerManager
from sluice.broker.filtering import compile_subscription
from sluice.broker.pull import pull_response_code
from sluice.errors import SelectorSyntaxError
from sluice.filter import tag_code
from sluice.protocol.codes import ResponseCode as R
from sluice.store.types import GetMessageStatus as S


class FakeConn:
    def __init__(self, name: str) -> None:
        self.peer = name
        self.is_closed = False


def sub(topic: str, expr: str = "*", etype: str | None = None, version: int = 1):
    return compile_subscription(topic, etype, expr, version, enable_property_filter=True)


def test_consumer_manager_membership_and_expiry():
    now = [0.0]
    changes: list[tuple[str, list]] = []
    cm = ConsumerManager(channel_expiry_s=120, clock=lambda: now[0], on_change=lambda g, c: changes.append((g, c)))
    a, b = FakeConn("a"), FakeConn("b")
    kw = dict(language="JAVA", version=1, consume_type="CONSUME_PASSIVELY", message_model="CLUSTERING",
              consume_from_where="CONSUME_FROM_LAST_OFFSET")
    assert cm.register_consumer("g", "ca", a, subscriptions=[sub("T")], **kw)
    assert cm.register_consumer("g", "cb", b, subscriptions=[sub("T")], **kw)
    assert not cm.register_consumer("g", "ca", a, subscriptions=[sub("T")], **kw)  # plain renewal
    assert cm.register_consumer("g", "ca", a, subscriptions=[sub("T", "TagA")], **kw)  # subscription changed
    assert len(changes) == 2 and cm.get("g").client_ids() == ["ca", "cb"]
    now[0] = 100
    cm.register_consumer("g", "cb", b, subscriptions=[sub("T")], **kw)
    now[0] = 150
    assert cm.expired_connections() == [a]
    assert cm.scan_expired() == ["ca"]
    assert cm.get("g").client_ids() == ["cb"] and changes[-1] == ("g", [b])
    assert cm.connection_closed(b) == ["cb"]
    assert cm.get("g") is None


def test_subscription_drops_topics_no_longer_sent():
    cm = ConsumerManager()
    kw = dict(language="JAVA", version=1, consume_type="CONSUME_PASSIVELY", message_model="CLUSTERING",
              consume_from_where="CONSUME_FROM_LAST_OFFSET")
    c = FakeConn("c")
    cm.register_consumer("g", "c", c, subscriptions=[sub("A"), sub("B")], **kw)
    cm.register_consumer("g", "c", c, subscriptions=[sub("B")], **kw)
    assert list(cm.get("g").subscriptions) == ["B"]


def test_tag_filter_is_exact_and_unit_only():
    f = sub("T", "Aa").filter
    assert not f.needs_record
    mask = f.match_units(np.array([tag_code("Aa"), tag_code("BB"), 0], dtype=np.int64))
    assert mask.tolist() == [True, False, False]
    assert sub("T", "*").filter.passes_all


def test_sql_filter_needs_records_and_bad_sql_raises():
    f = sub("T", "a > 1", "SQL92").filter
    assert f.needs_record and f.match_units(np.zeros(3, dtype=np.int64)) is None
    assert f.match_record({"a": "2"}) and not f.match_record({"a": "x"})
    with pytest.raises(SelectorSyntaxError):
        sub("T", "a >", "SQL92")


@pytest.mark.parametrize("status,offset,code", [
    (S.FOUND, 5, R.SUCCESS), (S.NO_MATCHED_MESSAGE, 5, R.PULL_RETRY_IMMEDIATELY),
    (S.MESSAGE_WAS_REMOVING, 5, R.PULL_RETRY_IMMEDIATELY), (S.NO_MESSAGE_IN_QUEUE, 0, R.PULL_NOT_FOUND),
    (S.NO_MESSAGE_IN_QUEUE, 3, R.PULL_OFFSET_MOVED), (S.NO_MATCHED_LOGIC_QUEUE, 0, R.PULL_NOT_FOUND),
    (S.NO_MATCHED_LOGIC_QUEUE, 1, R.PULL_OFFSET_MOVED), (S.OFFSET_FOUND_NULL, 5, R.PULL_NOT_FOUND),
    (S.OFFSET_OVERFLOW_ONE, 5, R.PULL_NOT_FOUND), (S.OFFSET_OVERFLOW_BADLY, 5, R.PULL_OFFSET_MOVED),
    (S.OFFSET_TOO_SMALL, 5, R.PULL_OFFSET_MOVED),
])
def test_pull_status_mapping(status, offset, code):
    assert pull_response_code(status, offset) == code
