"""ConsumerFilterManager: RocketMQ's registration rules, persistence, restore, cleaning; SubscriptionGuard."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.sub_conflicts import SubscriptionConflictError, SubscriptionGuard
from sluice.filter import BloomFilter


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def manager(tmp_path, clock, f: int = 20, n: int = 32, span: int = 24 * 3600 * 1000) -> ConsumerFilterManager:
    return ConsumerFilterManager(tmp_path / "config", bloom=BloomFilter(f, n), clean_span_ms=span, clock=clock)


def test_register_versions_rebuilds_and_bloom_bits(tmp_path, clock):
    m = manager(tmp_path, clock)
    assert m.register("T", "G", "a > 1", "SQL92", 10)
    d = m.get("T", "G")
    assert d.bloom.bit_pos == BloomFilter(20, 32).calc_bit_positions("G#T") and d.bloom.bit_num == 112
    assert m.sql_filters("T")[0].group == "G"
    assert not m.register("T", "G", "a > 2", "SQL92", 9)  # older: ignored
    assert not m.register("T", "G", "a > 2", "SQL92", 10)  # equal, alive: ignored
    assert m.get("T", "G").expression == "a > 1"
    clock.now += 5
    assert m.register("T", "G", "a > 2", "SQL92", 11)  # newer and changed: rebuilt, new born time
    assert m.get("T", "G").expression == "a > 2" and m.get("T", "G").born_time == clock.now
    assert not m.register("T", "G", "a >", "SQL92", 12)  # newer but does not compile: removed
    assert m.get("T", "G") is None and m.sql_filters("T") == ()


def test_dead_data_revives_and_is_cleaned(tmp_path, clock):
    m = manager(tmp_path, clock, span=1000)
    m.register_group("G", [("T", "SQL92", "a > 1", 5, None), ("U", "TAG", "TagA", 5, None)])
    assert m.get("U", "G").bloom is None and m.sql_filters("U") == ()
    clock.now += 10
    m.register_group("G", [("T", "SQL92", "a > 1", 5, None)])  # U no longer subscribed
    assert m.get("U", "G").is_dead and not m.get("T", "G").is_dead
    m.unregister("G")
    assert m.get("T", "G").is_dead and m.sql_filters("T")  # dead data still gets bitmaps
    assert m.register("T", "G", "a > 1", "SQL92", 5) and not m.get("T", "G").is_dead  # same version revives
    clock.now += 999
    assert m.clean() == 0
    clock.now += 1
    assert m.clean() == 1 and m.get("U", "G") is None and m.get("T", "G") is not None


def test_persisted_and_restored_dead_but_filtering(tmp_path, clock):
    m = manager(tmp_path, clock)
    m.register_group("G", [("T", "SQL92", "region = 'eu'", 7, None), ("U", "TAG", "TagA || TagB", 7, None)])
    assert m.persist()
    assert not m.persist()  # nothing changed
    doc = orjson.loads((tmp_path / "config" / "consumerFilter.json").read_bytes())
    assert doc["filterDataByTopic"]["T"]["groupFilterData"]["G"]["expression"] == "region = 'eu'"
    clock.now += 60_000
    again = manager(tmp_path, clock)
    assert again.load() == 2
    d = again.get("T", "G")
    assert d.selector.matches({"region": "eu"}) and d.is_dead and d.bloom == m.get("T", "G").bloom
    assert d.born_time == m.get("T", "G").born_time  # old bitmaps stay valid
    assert again.get("U", "G").selector.matches({"TAGS": "TagB"})
    assert again.register("T", "G", "region = 'eu'", "SQL92", 7) and not again.get("T", "G").is_dead


def test_bloom_sizing_change_keeps_entries_with_new_bits(tmp_path, clock):
    m = manager(tmp_path, clock)
    m.register("T", "G", "a > 1", "SQL92", 1)
    m.persist()
    clock.now += 5000
    again = manager(tmp_path, clock, f=10, n=64)
    assert again.load() == 1
    d = again.get("T", "G")
    assert again.bloom.is_valid(d.bloom) and d.born_time == clock.now  # bitmaps of the old sizing not trusted
    assert again.sql_filters("T")


def test_restored_entry_that_no_longer_compiles_keeps_its_error(tmp_path, clock):
    path = tmp_path / "config" / "consumerFilter.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(orjson.dumps({"filterDataByTopic": {"T": {"groupFilterData": {"G": {
        "expression": "a >", "expressionType": "SQL92", "clientVersion": 1, "bornTime": 1, "deadTime": 0}}}}}))
    m = manager(tmp_path, clock)
    assert m.load() == 1
    assert m.get("T", "G").selector is None and m.get("T", "G").error
    assert m.sql_filters("T") == ()


def test_guard_newest_wins_and_gone_members_do_not_block():
    g = SubscriptionGuard()
    g.check_heartbeat("G", "c1", [("T", "SQL92", "a > 1", 10)], [])
    g.check_heartbeat("G", "c1", [("T", "SQL92", "a > 1", 10)], ["c1"])
    with pytest.raises(SubscriptionConflictError) as e:
        g.check_heartbeat("G", "c2", [("T", "SQL92", "a > 2", 9)], ["c1"])
    assert "a > 1" in str(e.value) and "a > 2" in str(e.value)
    g.check_heartbeat("G", "c2", [("T", "SQL92", "a > 2", 9)], [])  # c1 is gone: accepted
    assert g.group_subscription("G", "T") == ("SQL92", "a > 2", 9)
    g.check_heartbeat("G", "c3", [("T", "SQL92", "a > 3", 11)], ["c2"])  # newer wins
    with pytest.raises(SubscriptionConflictError):
        g.check_pull("G", "T", "SQL92", "a > 2", 9, ["c2", "c3"])
    g.check_pull("G", "T", "SQL92", "a > 4", 12, ["c3"])  # newer than the group's: allowed
    assert [c.refused_expression for c in g.conflicts_of("G")] == ["a > 2", "a > 2"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["register", "group", "unregister", "clean", "tick"]),
                          st.sampled_from(["T", "U", "V"]), st.sampled_from(["G1", "G2", "G3"]),
                          st.sampled_from([("SQL92", "a > 1"), ("SQL92", "b = 'x'"), ("TAG", "TagA"),
                                           ("SQL92", "a >")]),
                          st.integers(1, 4)), max_size=30))
def test_the_sql_snapshot_rebuilt_per_topic_equals_a_whole_rebuild(tmp_path, ops) -> None:
    """A registration rebuilds only its topic's SQL92 entries, and a heartbeat looks at its group's topics
    alone (it costs the same however many groups and topics the broker has): after any sequence of changes
    the snapshot is what rebuilding every topic gives, and the group index is the table's."""
    clock = Clock()
    m = manager(tmp_path, clock, span=30)
    for op, topic, group, (etype, expression), version in ops:
        if op == "register":
            m.register(topic, group, expression, etype, version)
        elif op == "group":
            m.register_group(group, [(topic, etype, expression, version, None)])
        elif op == "unregister":
            m.unregister(group)
        elif op == "clean":
            m.clean()
        else:
            clock.now += 20
        incremental = {t: [(e.group, e.selector, e.bloom) for e in entries] for t, entries in m.sql_topics().items()}
        m._changed()
        assert incremental == {t: [(e.group, e.selector, e.bloom) for e in entries]
                               for t, entries in m.sql_topics().items()}
        # the group -> topics index a heartbeat walks is the table's, inverted (no empty topics kept)
        inverted: dict[str, set[str]] = {}
        for t, by_group in m.table.items():
            assert by_group
            for g in by_group:
                inverted.setdefault(g, set()).add(t)
        assert m._topics_of == inverted
