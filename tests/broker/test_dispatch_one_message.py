"""The dispatchers' one-message road: CalcBitmapDispatcher and HoldService given a one-request list do what
they do for that request inside a longer list (same bitmaps and counters; same pulls woken)."""
from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.bitmap import CalcBitmapDispatcher
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.filtering import SelectorFilter
from sluice.broker.longpoll import TIMED_OUT, HoldService
from sluice.filter import BloomFilter, compile_selector
from sluice.format import tag_code
from sluice.protocol import properties as P
from sluice.store.dispatch_request import DispatchRequest

EXPRS = ["a < 100", "region IN ('eu', 'jp') AND a > 500", "TAGS = 'TagA'", "odd > 1", "region <> 'cn'",
         "b IS NOT NULL"]
TOPICS = ("Sql", "Sql2", "Plain")


def _requests(rng: random.Random, n: int) -> list[DispatchRequest]:
    out = []
    for i in range(n):
        props = {"a": str(rng.randrange(1000)), "region": rng.choice(["eu", "us", "cn", "jp"])}
        if rng.random() < 0.5:
            props[P.TAGS] = rng.choice(["TagA", "TagB"])
        if rng.random() < 0.2:
            props["odd"] = "x"  # a type error: no match
        out.append(DispatchRequest(rng.choice(TOPICS), 0, i, 100 * i, 100, 0, props, 1, [], None))
    return out


def _manager(tmp_path, exprs: list[str]) -> ConsumerFilterManager:
    m = ConsumerFilterManager(tmp_path / "config", bloom=BloomFilter(20, 32))
    for k, e in enumerate(exprs):
        assert m.register("Sql", f"G{k}", e, "SQL92", 1)
    assert m.register("Sql2", "H", exprs[0], "SQL92", 1)
    return m


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), exprs=st.lists(st.sampled_from(EXPRS), min_size=1, max_size=4, unique=True),
       n=st.integers(1, 60))
def test_bitmap_of_one_message_equals_its_bitmap_in_a_batch(tmp_path_factory, seed, exprs, n):
    manager = _manager(tmp_path_factory.mktemp("f"), exprs)
    rng = random.Random(seed)
    batch, single = _requests(rng, n), _requests(random.Random(seed), n)
    whole, one = CalcBitmapDispatcher(manager), CalcBitmapDispatcher(manager)
    whole.dispatch(batch)
    for r in single:
        one.dispatch([r])
    assert [r.bitmap for r in single] == [r.bitmap for r in batch]
    assert [r.bitmap is None for r in batch] == [r.topic == "Plain" for r in batch]
    assert (one.messages, one.evaluations) == (whole.messages, whole.evaluations)


def _outcomes(requests: list[DispatchRequest], one_by_one: bool) -> list[int]:
    async def main() -> list[int]:
        hold = HoldService(lambda t, q: 0, check_interval_s=60)
        hold.start()
        filters = [None, SelectorFilter(compile_selector("TAG", "TagB")),
                   SelectorFilter(compile_selector("SQL92", "region = 'eu'")),
                   SelectorFilter(compile_selector("TAG", "TagZ")), None, None]
        keys = [("Sql", 0), ("Sql", 0), ("Sql2", 0), ("Sql2", 0), ("Plain", 0), ("Other", 0)]
        offsets = [3, 0, 0, 0, 1, 0]
        tasks = [asyncio.create_task(hold.hold(t, q, off, f, 0.3)) for (t, q), off, f in zip(keys, offsets, filters)]
        await asyncio.sleep(0.01)
        if one_by_one:
            for r in requests:
                hold.dispatch([r])
        else:
            hold.dispatch(requests)
        out = await asyncio.gather(*tasks)
        await hold.stop()
        return out
    return asyncio.run(main())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8))
def test_hold_one_message_at_a_time_wakes_the_pulls_a_batch_wakes(seed, n):
    reqs = _requests(random.Random(seed), n)
    seen: dict[str, int] = {}
    for r in reqs:  # queue offsets per topic and tag codes, as dispatch gives them
        r.queue_offset = seen[r.topic] = seen.get(r.topic, -1) + 1
        r.tag_code = tag_code(r.properties.get(P.TAGS))
    batch = _outcomes(reqs, one_by_one=False)
    single = _outcomes(reqs, one_by_one=True)
    # a woken pull answers with the end of what woke it: one message at a time, an earlier end than the batch's
    assert [o == TIMED_OUT for o in single] == [o == TIMED_OUT for o in batch]


def test_hold_one_message_wakes_a_matching_pull_at_once():
    r = DispatchRequest("Sql2", 0, 0, 0, 100, 0, {"region": "eu", "a": "1"}, 1, [], None)
    assert _outcomes([r], one_by_one=True) == [TIMED_OUT, TIMED_OUT, 100, TIMED_OUT, TIMED_OUT, TIMED_OUT]


def _batch_outcomes(runs: list, columnar: bool) -> list[int]:
    from sluice.store.dispatch_columns import DispatchBatch

    async def main() -> list[int]:
        hold = HoldService(lambda t, q: 0, check_interval_s=60)
        hold.start()
        filters = [None, SelectorFilter(compile_selector("TAG", "TagB")),
                   SelectorFilter(compile_selector("SQL92", "region = 'eu'")),
                   SelectorFilter(compile_selector("TAG", "TagZ")), None]
        offsets = [2, 0, 0, 0, 0]
        keys = [("T", 0)] * 4 + [("Other", 0)]
        tasks = [asyncio.create_task(hold.hold(t, q, off, f, 0.3)) for (t, q), off, f in zip(keys, offsets, filters)]
        await asyncio.sleep(0.01)
        batch = DispatchBatch(runs)
        fn = hold.dispatch_batch if columnar else (lambda b: hold.dispatch(b.requests()))
        fn(batch)
        out = await asyncio.gather(*tasks)
        await hold.stop()
        return out
    return asyncio.run(main())


@settings(max_examples=10, deadline=None)
@given(tags=st.lists(st.sampled_from(["TagA", "TagB", None]), min_size=1, max_size=4),
       regions=st.lists(st.sampled_from(["eu", "us"]), min_size=4, max_size=4))
def test_hold_columnar_one_run_wakes_what_requests_wake(tags, regions):
    """HoldService.dispatch_batch of a batch of one run (its own road) wakes the pulls dispatch(requests) wakes."""
    from sluice.store.dispatch_columns import PutRun

    def run() -> PutRun:
        n = len(tags)
        props = [P.encode_properties({**({P.TAGS: t} if t else {}), "region": r}) for t, r in zip(tags, regions)]
        return PutRun("T", 0, [100] * n, [0] * n, props, list(tags), [None] * n, [None] * n,
                      phys=[100 * i for i in range(n)], qoffs=list(range(n)), store_timestamp=1)

    assert _batch_outcomes([run()], columnar=True) == _batch_outcomes([run()], columnar=False)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), exprs=st.lists(st.sampled_from(EXPRS), min_size=1, max_size=3, unique=True),
       n=st.integers(1, 30))
def test_store_one_message_per_dispatch_writes_the_bitmaps_of_one_batch(tmp_path_factory, seed, exprs, n):
    """Through the store: one message per dispatch step (the dispatchers' and write_one's roads) gives the
    ext units' tag codes and bitmaps that one batch of all of them gives."""
    import numpy as np
    from filtering_support import FilteredStore, props_of

    from sluice.store import StoreMessage

    root = tmp_path_factory.mktemp("st")
    rng = random.Random(seed)
    props = [props_of(i, rng) for i in range(n)]
    one, whole = FilteredStore(root / "one"), FilteredStore(root / "whole")
    try:
        for s in (one, whole):
            for k, e in enumerate(exprs):
                assert s.manager.register("P", f"G{k}", e, "SQL92", 1)
        for p in props:
            one.store.put_messages([StoreMessage("P", b"m", 0, dict(p))])
            assert one.store.wait_dispatched(10.0)
        whole.store.put_messages([StoreMessage("P", b"m", 0, dict(p)) for p in props])
        assert whole.store.wait_dispatched(10.0)
        got = []
        for s in (one, whole):
            slots = s.store.queues.get("P", 0).get_units(0, n)["tag"].astype(np.int64)
            units = s.store.ext.get("P", 0).get_many(slots)
            assert units.valid.all()
            got.append((units.tags_codes.tolist(), [bytes(b) for b in units.bitmaps],
                        s.dispatcher.messages, s.dispatcher.evaluations))
        assert got[0] == got[1]
    finally:
        one.close()
        whole.close()
