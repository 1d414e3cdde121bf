"""CalcBitmapDispatcher's columnar road: the bitmaps ``speedups.props_rows`` gives a batch's runs
(``PutRun.bitmaps``, each distinct combination of the values the selectors read judged once) are the bitmaps
the per-message requests road gives, and the store writes the same ext units and consume-queue slots from
them, transactional records without a unit included."""
from __future__ import annotations

import random

import numpy as np
import pytest
from filtering_support import FilteredStore, props_of
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.bitmap import CalcBitmapDispatcher
from sluice.format import FLAG_TRANSACTION_PREPARED
from sluice.protocol import properties as P
from sluice.speedups import C
from sluice.store import StoreMessage
from sluice.store.pull_read import verdict_cache

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

EXPRS = ["a < 100", "region IN ('eu', 'jp') AND a > 500", "TAGS = 'TagA'", "odd > 1", "region <> 'cn'",
         "b IS NOT NULL", "n = '7' OR a BETWEEN 10 AND 20"]


class Materialise:
    """A plug-in dispatcher after the bitmaps that asks for requests: the store then writes from them."""

    def dispatch(self, requests):  # type: ignore[no-untyped-def]
        pass

    def dispatch_batch(self, batch):  # type: ignore[no-untyped-def]
        batch.requests()


def _units(s: FilteredStore, n: int) -> tuple[list[int], list[bool], list[int], list[bytes]]:
    slots = s.store.queues.get("P", 0).get_units(0, n)["tag"].astype(np.int64)
    units = s.store.ext.get("P", 0).get_many(slots)
    with_unit = (slots < 0).tolist()
    return (slots[~(slots < 0)].tolist(), with_unit, units.tags_codes[units.valid].tolist(),
            [bytes(b) for b, ok in zip(units.bitmaps, units.valid) if ok])


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), exprs=st.lists(st.sampled_from(EXPRS), min_size=1, max_size=4, unique=True),
       n=st.integers(1, 80), prepared=st.booleans())
def test_columns_and_requests_write_the_same_units(tmp_path_factory, seed, exprs, n, prepared):
    root = tmp_path_factory.mktemp("cols")
    rng = random.Random(seed)
    props = [props_of(i, rng) for i in range(n)]
    flags = [FLAG_TRANSACTION_PREPARED if prepared and rng.random() < 0.3 else 0 for _ in range(n)]
    # cols: bitmaps and units from the columns; late: bitmaps from the columns, units from requests built
    # after them; early: requests built before the bitmaps, which then go the per-message road
    cols, late, early = FilteredStore(root / "cols"), FilteredStore(root / "late"), FilteredStore(root / "early",
                                                                                                   bitmaps=False)
    late.store.add_dispatcher(Materialise())
    early.store.add_dispatcher(Materialise())
    early.dispatcher = CalcBitmapDispatcher(early.manager)
    early.store.add_dispatcher(early.dispatcher)
    stores = (cols, late, early)
    try:
        for s in stores:
            for k, e in enumerate(exprs):
                assert s.manager.register("P", f"G{k}", e, "SQL92", 1)
            s.store.put_messages([StoreMessage("P", b"m", 0, dict(p), sysflag=f) for p, f in zip(props, flags)])
            assert s.store.wait_dispatched(10.0)
        queued = sum(1 for f in flags if f == 0)
        got = [_units(s, queued) for s in stores]
        assert got[0] == got[1] == got[2]
        assert all(got[0][1])  # every queued record of a topic with SQL92 filters has an ext unit
        for s in stores:
            assert (s.dispatcher.messages, s.dispatcher.evaluations) == (n, n * len(exprs))
        [cols_plan], [early_plan] = cols.dispatcher._plans.values(), early.dispatcher._plans.values()
        assert cols_plan.row_list and not early_plan.row_list  # which road each took
    finally:
        for s in stores:
            s.close()


def test_props_rows_judges_each_combination_once() -> None:
    judged: list[tuple[str | None, ...]] = []
    rows = [b"none"]

    def judge(values: tuple[str | None, ...]) -> int:
        judged.append(values)
        rows.append(repr(values).encode())
        return len(rows) - 1

    props = [P.encode_properties({"region": r, "a": a, P.UNIQ_KEY: str(i)})
             for i, (r, a) in enumerate([("eu", "1"), ("us", "1"), ("eu", "1"), ("eu", "2")] * 3)]
    props.append(P.encode_properties({"other": "x"}))
    cache = verdict_cache()
    got = C.props_rows(props, (b"region", b"a"), cache, judge, rows)
    assert judged == [("eu", "1"), ("us", "1"), ("eu", "2"), (None, None)]
    assert got == [repr(v).encode() for v in [("eu", "1"), ("us", "1"), ("eu", "1"), ("eu", "2")] * 3] + [
        b"(None, None)"]
    assert C.props_rows(props, (b"region", b"a"), cache, judge, rows) == got and len(judged) == 4  # all cached


def test_props_rows_refuses_what_it_cannot_use() -> None:
    props = [P.encode_properties({"a": "1"})]
    for bad in (5, 1, -1):  # a judge's index outside rows fails, and is not kept for the next call
        cache = verdict_cache()
        with pytest.raises(IndexError, match=f"gave {bad}"):
            C.props_rows(props, (b"a",), cache, lambda v, b=bad: b, [b"x"])
        assert C.verdict_cache_len(cache) == 0
        assert C.props_rows(props, (b"a",), cache, lambda v: 0, [b"x"]) == [b"x"]
    with pytest.raises(TypeError):
        C.props_rows([b"a\x011"], (b"a",), verdict_cache(), lambda v: 0, [b"x"])
    with pytest.raises(TypeError):
        C.props_rows(props, ("a",), verdict_cache(), lambda v: 0, [b"x"])
    shrinking = [P.encode_properties({"a": str(i)}) for i in range(3)]
    with pytest.raises(RuntimeError, match="changed size"):  # a judge that cuts the list short
        C.props_rows(shrinking, (b"a",), verdict_cache(), lambda v: shrinking.clear() or 0, [b"x"])
    with pytest.raises(ZeroDivisionError):  # judge's own error reaches the caller
        C.props_rows(props, (b"b",), verdict_cache(), lambda v: 1 // 0, [b"x"])
