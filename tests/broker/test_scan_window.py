"""A filtered pull's window (maxScanUnits, the push consumer's span room): the store looks at that many units
when it is more than its own window, capped by max_filter_scan_units; the answers are the same stream."""
from __future__ import annotations

import random

import pytest
from filtering_support import FilteredStore, InProcessBroker, props_of, put, small_store_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.broker.filtering import SelectorFilter
from sluice.filter import compile_selector
from sluice.protocol.headers import PullMessageRequestHeader
from sluice.protocol.record import iter_records
from sluice.store.types import GetMessageStatus as S

WINDOW = 800  # max_filter_scan_bytes // 20 at the defaults


def test_the_header_carries_max_scan_units_only_when_set() -> None:
    base = dict(consumer_group="G", topic="T", queue_id=0, queue_offset=0, max_msg_nums=32, sys_flag=0,
                commit_offset=0, suspend_timeout_millis=0, sub_version=0)
    ext = PullMessageRequestHeader(**base, max_scan_units=2000).to_ext()
    assert ext["maxScanUnits"] == "2000"
    assert PullMessageRequestHeader.from_ext(ext).max_scan_units == 2000
    plain = PullMessageRequestHeader(**base).to_ext()
    assert "maxScanUnits" not in plain and PullMessageRequestHeader.from_ext(plain).max_scan_units is None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 3000), scan=st.sampled_from([0, 100, 800, 1000, 2000, 9000]),
       max_msgs=st.sampled_from([1, 32, 256]), bitmaps=st.booleans(),
       expr=st.sampled_from(["a < 50", "region = 'eu'", "a >= 990", "TAGS = 'TagA'"]))
def test_a_wider_window_gives_the_same_stream_and_spans_no_more_than_asked(tmp_path_factory, seed, n, scan,
                                                                            max_msgs, bitmaps, expr):
    cap = 1500
    fs = FilteredStore(tmp_path_factory.mktemp("win") / "s", bitmaps=bitmaps,
                       store_config=small_store_config(max_filter_scan_units=cap))
    try:
        rng = random.Random(seed)
        props = [props_of(i, rng) for i in range(n)]
        put(fs.store, "W", props)
        sel = compile_selector("SQL92", expr)
        want = [i for i, p in enumerate(props) if sel.matches(p)]
        window = max(WINDOW, max_msgs, min(scan, cap))
        base = SelectorFilter(sel)
        got: list[int] = []
        off = 0
        while off < n:
            res = fs.store.get_messages("W", 0, off, max_msgs, base.for_pull(), None, scan)
            if res.status is S.FOUND:
                assert res.queue_offsets[-1] - off < window  # the answer's span: at most the window
                got += res.queue_offsets
            else:
                assert res.status is S.NO_MATCHED_MESSAGE
            assert res.next_begin_offset > off
            off = res.next_begin_offset
        assert got == want
    finally:
        fs.close()


def test_an_unfiltered_pull_ignores_the_window(tmp_path) -> None:
    fs = FilteredStore(tmp_path / "s", bitmaps=False)
    try:
        put(fs.store, "U", [props_of(i) for i in range(100)])
        res = fs.store.get_messages("U", 0, 0, 10, None, None, 2000)
        assert res.queue_offsets == list(range(10))
    finally:
        fs.close()


@pytest.fixture
def broker(tmp_path):
    b = InProcessBroker(tmp_path / "store")
    yield b
    b.stop()


def test_the_broker_scans_what_the_pull_asks(broker) -> None:
    """A catch-up SQL92 pull (no Bloom data) with maxScanUnits looks at that many units; without, at the
    broker's window: its nextBeginOffset says how far it looked."""
    rpc = broker.rpc()
    for i in range(3000):
        rpc.send("S", b"m", {"a": "1" if i % 500 else "7"})
    expr = "a = 12345"  # nothing matches: every pull looks at its whole window
    from sluice.protocol.codes import RequestCode
    from sluice.protocol.command import RemotingCommand

    def pull(offset: int, scan: int | None) -> RemotingCommand:
        rpc.settle()
        fields = dict(consumerGroup="G", topic="S", queueId=0, queueOffset=offset, maxMsgNums=32, sysFlag=0x4,
                      commitOffset=0, suspendTimeoutMillis=0, subVersion=0, subscription=expr,
                      expressionType="SQL92")
        if scan is not None:
            fields["maxScanUnits"] = scan
        return rpc.call(RequestCode.PULL_MESSAGE, fields)

    assert int(pull(0, None).ext_fields["nextBeginOffset"]) == WINDOW
    assert int(pull(0, 2000).ext_fields["nextBeginOffset"]) == 2000
    assert int(pull(0, 100).ext_fields["nextBeginOffset"]) == WINDOW  # never less than the broker's window
    bad = pull(0, "many")  # type: ignore[arg-type]
    assert bad.code != 0 and "maxScanUnits" in (bad.remark or "")
    expr = "a = 7"
    r = pull(0, 2000)
    assert r.code == 0 and len(list(iter_records(r.body))) == 4  # offsets 0, 500, 1000, 1500
