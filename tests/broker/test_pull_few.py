"""A woken held pull's few units (store/pull_read.py and broker/filtering.py with SMALL_BATCH or fewer units in
the window: lists of Python bools and ints) against the vectorised path (the same code with SMALL_BATCH 0),
on a bitmapped topic: random windows at the queue's end, SQL92 groups with and without their Bloom data, tag
groups, live-after bounds, evaluation budgets and ext rows gone from the ext files (units decided on the
record). The same GetMessageResult, store counters and FilterMetrics."""
from __future__ import annotations

import random
from dataclasses import asdict

import numpy as np
import pytest
from filtering_support import FilteredStore, props_of, put
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.broker import filtering
from sluice.broker.filter_data import FilterMetrics
from sluice.broker.filtering import SelectorFilter
from sluice.filter import compile_selector
from sluice.store import ext_files, pull_read
from sluice.store.consumequeue_ext import SMALL_BATCH

N = 120
GROUPS = {"Geu": "region = 'eu'", "Ga": "a >= 500", "Godd": "odd > 1 OR region = 'us'", "Gn": "n < 60"}
TAGS = ["TagA", "TagA || TagB", "*", "TagC || Nope"]


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    s = FilteredStore(tmp_path_factory.mktemp("few") / "store")
    for topic in ("T", "M"):
        for g, expr in GROUPS.items():
            assert s.manager.register(topic, g, expr, "SQL92", 1)
            s.manager.get(topic, g).born_time -= 10_000
    rng = random.Random(7)
    for topic in ("T", "M"):
        put(s.store, topic, [props_of(i, rng) for i in range(N)], batch=7)
    # "M" loses the ext units of its last 25 messages: their consume-queue units point at nothing
    cq, ext = s.store.queues.get("M", 0), s.store.ext.get("M", 0)
    ext.truncate(int(cq.get_units(N - 25, 1)["tag"][0]))
    yield s
    s.close()


def pull(fs: FilteredStore, topic: str, offset: int, max_msgs: int, kind: str, what: str, live: int,
         budget: int) -> dict:
    m = FilterMetrics()
    if kind == "TAG":
        mf = SelectorFilter(compile_selector("TAG", what)).for_pull(m)
    else:
        base = SelectorFilter(compile_selector("SQL92", GROUPS[what]))
        fd = fs.manager.get(topic, what)
        mf = base.for_pull(m, fs.manager.bloom, fd.bloom, live) if kind == "bloom" else base.for_pull(m)
    mf.max_evaluations = budget
    st_ = fs.store
    before = st_.pull_records_read, st_.pull_bytes_read
    out = asdict(st_.get_messages(topic, 0, offset, max_msgs, mf))
    out["counted"] = (st_.pull_records_read - before[0], st_.pull_bytes_read - before[1])
    out["metrics"] = asdict(m)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topic=st.sampled_from(["T", "M"]), back=st.integers(1, SMALL_BATCH), max_msgs=st.integers(1, 20),
       kind=st.sampled_from(["bloom", "bloom", "plain", "TAG"]), group=st.sampled_from(sorted(GROUPS)),
       tag=st.sampled_from(TAGS), live_at=st.integers(0, N), budget=st.sampled_from([0, 0, 1, 3]))
def test_few_units_equal_the_vectorised_path(fs, monkeypatch, topic, back, max_msgs, kind, group, tag, live_at,
                                             budget) -> None:
    cq = fs.store.queues.get(topic, 0)
    # live-after: the store time of one of the messages (or none): units stored at or before it are not
    # decided on their bitmaps
    times = fs.store.ext.get("T", 0).get_many(fs.store.queues.get("T", 0).get_units(0, N)["tag"].astype(np.int64))
    live = int(times.msg_store_times[live_at]) if live_at < N else 0
    args = (fs, topic, cq.max_offset - back, max_msgs, kind, tag if kind == "TAG" else group, live, budget)
    few = pull(*args)
    for mod in (pull_read, filtering, ext_files):
        monkeypatch.setattr(mod, "SMALL_BATCH", 0)
    many = pull(*args)
    monkeypatch.undo()
    assert few == many


def test_missing_ext_rows_are_decided_on_the_record(fs) -> None:
    """The fixture's truncated ext tail is what the property test covers: those units resolve to nothing."""
    cq = fs.store.queues.get("M", 0)
    slots = cq.get_units(N - SMALL_BATCH, SMALL_BATCH)["tag"]
    _, _, unresolved = ext_files.resolve_units(fs.store.ext.get("M", 0), slots)
    assert unresolved is not None and unresolved.all()
