"""A filtered pull that found fewer records than asked reads on past its first window (PullReader._fill):
more matches per round trip, never a record skipped, twice delivered or over the pull's bounds."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_testlib import msg, small_config

from sluice.broker.filter_data import FilterMetrics
from sluice.broker.filtering import SelectorFilter
from sluice.filter import compile_selector
from sluice.store import MessageStore, pull_read
from sluice.store.types import GetMessageStatus as S

N = 6000
WINDOW = 800  # units a filtered pull's first window reads (max_filter_scan_bytes 16000 / 20)
REGIONS = 20  # region r0 is every 20th message: 5 %, 40 in a window


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    # A long scan deadline: how far a pull reads on is then decided by its bounds alone, not by the clock.
    s = MessageStore(tmp_path_factory.mktemp("fill") / "store",
                     small_config(consumequeue_units_per_file=1024, max_filter_scan_ms=60_000.0))
    s.start()
    for i in range(0, N, 100):
        s.put_messages([msg(body=b"m%05d" % j + b"." * (j % 7 * 50), TAGS=f"Tag{j % REGIONS}",
                            region=f"r{j % REGIONS}") for j in range(i, i + 100)])
    s.wait_dispatched()
    yield s
    s.close()


def _filter(kind: str, expression: str) -> SelectorFilter:
    return SelectorFilter(compile_selector(kind, expression)).for_pull(FilterMetrics())


def _drain(store: MessageStore, kind: str, expression: str, max_msgs: int, max_bytes: int | None
           ) -> tuple[list[int], list[int]]:
    """Every queue offset delivered by pulls from 0 to the end, and each pull's count."""
    got: list[int] = []
    counts: list[int] = []
    offset = 0
    for _ in range(N):
        r = store.get_messages("T", 0, offset, max_msgs, _filter(kind, expression), max_bytes)
        if r.status is S.FOUND:
            assert len(r.sizes) <= max_msgs
            assert len(r.data) == sum(r.sizes)
            assert max_bytes is None or len(r.data) <= max_bytes or len(r.sizes) == 1
            got += r.queue_offsets
            counts.append(len(r.sizes))
        else:
            assert r.status in (S.NO_MATCHED_MESSAGE, S.OFFSET_OVERFLOW_ONE), r.status
        if r.next_begin_offset >= N or r.status is S.OFFSET_OVERFLOW_ONE:
            return got, counts
        assert r.next_begin_offset > offset
        offset = r.next_begin_offset
    raise AssertionError("the drain did not end")


@pytest.mark.parametrize("kind,expression", [("SQL92", "region = 'r0'"), ("TAG", "Tag0")])
def test_a_selective_pull_reads_on_past_its_first_window(store, kind, expression) -> None:
    r = store.get_messages("T", 0, 0, 256, _filter(kind, expression), None)
    assert r.status is S.FOUND
    assert len(r.sizes) == 256  # a first window alone holds 40
    assert r.queue_offsets == list(range(0, 256 * REGIONS, REGIONS))
    assert r.next_begin_offset == 255 * REGIONS + 1  # goes on right after the last one taken


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind_expr=st.sampled_from([("SQL92", "region = 'r0'"), ("SQL92", "region IN ('r3', 'r7')"),
                                  ("TAG", "Tag5"), ("SQL92", "region = 'nowhere'")]),
       max_msgs=st.integers(1, 400), max_bytes=st.one_of(st.none(), st.integers(1, 40_000)))
def test_a_drain_delivers_every_match_once_in_order(store, kind_expr, max_msgs, max_bytes) -> None:
    kind, expression = kind_expr
    got, counts = _drain(store, kind, expression, max_msgs, max_bytes)
    sel = compile_selector(kind, expression)
    want = [j for j in range(N) if sel.matches({"TAGS": f"Tag{j % REGIONS}", "region": f"r{j % REGIONS}"})]
    assert got == want


def test_the_python_twin_fills_alike(store, monkeypatch) -> None:
    fast = store.get_messages("T", 0, 7, 300, _filter("SQL92", "region = 'r1' OR region = 'r2'"), 100_000)
    monkeypatch.setattr(pull_read, "C", None)
    slow = store.get_messages("T", 0, 7, 300, _filter("SQL92", "region = 'r1' OR region = 'r2'"), 100_000)
    assert fast == slow
    assert len(fast.sizes) > 2 * WINDOW // REGIONS


def test_records_evaluated_one_by_one_stay_one_window_per_pull(store) -> None:
    """A selector naming too many properties for the value scan: each record is evaluated in Python, so a
    pull reads one window, as RocketMQ's does."""
    many = " OR ".join(f"p{i} = 'x'" for i in range(pull_read.MAX_RECORD_KEYS + 1))
    r = store.get_messages("T", 0, 0, 256, _filter("SQL92", f"region = 'r0' OR {many}"), None)
    assert r.status is S.FOUND
    assert len(r.sizes) == WINDOW // REGIONS
    assert r.next_begin_offset == WINDOW
