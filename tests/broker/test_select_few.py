"""SelectorFilter's small-window path (a woken held pull's few units, on Python ints) against its vectorised
path: the same masks, the same per-record hits and the same FilterMetrics counts."""
from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.filter_data import FilterMetrics
from sluice.broker.filtering import SelectorFilter
from sluice.filter import BloomFilter, compile_selector
from sluice.store.consumequeue_ext import SMALL_BATCH, ExtBatch, FewExtBatch

BLOOM = BloomFilter(20, 32)
NBYTES = BLOOM.m // 8
LIVE_AFTER = 1_000


@st.composite
def windows(draw):
    n = draw(st.integers(1, SMALL_BATCH))
    width = draw(st.sampled_from([NBYTES, NBYTES + 3]))
    key = draw(st.text(min_size=1, max_size=8))
    data = BLOOM.generate(key)
    rows = []
    for _ in range(n):
        kind = draw(st.sampled_from(["hit", "random", "zero"]))
        row = bytearray(draw(st.binary(min_size=width, max_size=width))) if kind == "random" else bytearray(width)
        if kind == "hit":
            for pos in data.bit_pos:
                row[pos >> 3] |= 1 << (pos & 7)
        rows.append(bytes(row))
    bitmaps = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(n, width).copy()
    lengths = np.array(draw(st.lists(st.sampled_from([NBYTES, NBYTES, NBYTES - 1, 0]), min_size=n, max_size=n)),
                       dtype=np.int32)
    times = np.array(draw(st.lists(st.integers(LIVE_AFTER - 2, LIVE_AFTER + 2), min_size=n, max_size=n)),
                     dtype=np.int64)
    valid = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)  # False: a missing ext row
    batch = ExtBatch(np.zeros(n, dtype=np.int64), bitmaps, lengths, times, valid)
    verdicts = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    consumed = draw(st.integers(0, n))
    return data, batch, verdicts, consumed


def as_few(batch: ExtBatch) -> FewExtBatch:
    """The same rows as get_few keeps them (lists, no arrays)."""
    return FewExtBatch(batch.tags_codes.tolist(), batch.valid.tolist(), batch.bitmap_lengths.tolist(),
                       batch.msg_store_times.tolist(), batch.bitmaps.tobytes(), batch.bitmaps.shape[1])


def run(data, batch, verdicts, consumed, few: bool, lists: bool = False):
    f = SelectorFilter(compile_selector("SQL92", "region = 'eu'")).for_pull(FilterMetrics(), BLOOM, data, LIVE_AFTER)
    f._messages.extend(["e0", "e1", "e2"])
    nbytes, check_all = BLOOM.m // 8, np.ones(len(batch), dtype=bool)
    if lists:  # get_few's batch: the filter decides on its lists and builds none of its arrays
        batch = as_few(batch)
        keep, check = f._select_sql(np.zeros(len(batch), dtype=np.int64), batch)
        assert batch._arrays is None
    else:
        keep, check = (f._select_sql_few if few else f._select_sql_many)(batch, nbytes, check_all)
    hits = None if f._hits is None else [bool(h) for h in f._hits]
    if keep is not None:
        idx = np.flatnonzero(check).astype(np.int32)
        f.settle(idx, np.array([verdicts[i] for i in idx], dtype=np.int32))
    f.consumed(consumed)
    return (None if keep is None else keep.tolist(), check.tolist(), hits, dataclasses.asdict(f.metrics))


@settings(max_examples=300, deadline=None)
@given(windows())
def test_few_equals_many(w):
    assert run(*w, few=True) == run(*w, few=False)


@settings(max_examples=300, deadline=None)
@given(windows())
def test_few_lists_equal_many(w):
    """A FewExtBatch (get_few's lists) gives the vectorised path's masks, hits and counts."""
    assert run(*w, few=True, lists=True) == run(*w, few=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=SMALL_BATCH), st.data())
def test_settle_few_equals_many(verdicts, data):
    """settle without bitmaps (no _hits) and with vectorised ones: the same counts either way."""
    n = len(verdicts)
    hits = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    out = []
    for few in (True, False):
        f = SelectorFilter(compile_selector("SQL92", "a > 1")).for_pull(FilterMetrics())
        f._messages.extend(["e0", "e1", "e2"])
        f._hits = hits
        idx, v = np.arange(n, dtype=np.int32), np.array(verdicts, dtype=np.int32)
        if few:
            f.settle(idx, v)
        else:  # the vectorised counts, on a window longer than SMALL_BATCH that repeats this one
            rep = SMALL_BATCH // n + 1
            f._hits = np.tile(hits, rep)
            f.settle(np.arange(n * rep, dtype=np.int32), np.tile(v, rep))
            m = f.metrics
            for k in ("evaluated", "matched", "errors", "bitmap_false_positives"):
                setattr(m, k, getattr(m, k) // rep)
        out.append(dataclasses.asdict(f.metrics))
    assert out[0] == out[1]
