"""Filtered pulls that take few of the units they pass over: the store's read, in process, per pull.

The common workload's messages (``sluice bench``, issue 15: 1 KiB, tag TagA..TagJ, ``region`` of 10
values, ``a`` 0..99, and the UNIQ_KEY and WAIT properties the SDK adds) go to 4 queues in runs of 32
(written by catchup_pull.py's ``fill``, with the SQL92 groups' bitmap dispatcher), as
its ``send_batch`` of 32 sends them, so a queue's records lie apart in the commit log. Each queue is then
drained with the pulls the push consumer makes (up to 256 messages over at most 2,000 units), through the
broker's pull filters (broker/filtering.py SelectorFilter):

* ``tag``: ``TagA``, decided on the units' tag codes (no record read but those taken);
* ``region`` and ``sql92`` ``before``: a group subscribed before the writes, so the units' bitmaps rule
  out most records and only the rest are read and evaluated;
* ``region`` and ``sql92`` ``catchup``: a group that subscribed afterwards, every record evaluated.

Per drain: CPU microseconds per pull and per matched message (time.process_time, the pulls only), the
median of the rounds, the drains alternating. The first three rows read one record in ten or twenty:
how fast they go depends on fetching only those records' lines ahead of the loop (speedups.h
prefetch_next).

    .venv/bin/python benchmarks/sparse_pull.py [--quick] [--messages N] [--rounds R]

--quick uses 100,000 messages instead of 1,000,000. Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catchup_pull import BODY, TOPIC, fill, pull_queues, store_config  # noqa: E402  (its store, layout and pulls)

from sluice.bench.workload import FILTERS  # noqa: E402
from sluice.broker.bitmap import CalcBitmapDispatcher  # noqa: E402
from sluice.broker.filter_data import LIVE_MARGIN_MS, ConsumerFilterManager  # noqa: E402
from sluice.broker.filtering import SelectorFilter  # noqa: E402
from sluice.filter import BloomFilter, compile_selector  # noqa: E402
from sluice.speedups import C  # noqa: E402
from sluice.store import MessageStore  # noqa: E402

QUEUES = 4
#: What the push consumer asks of a pull once it has seen the backlog (push_options: pull_batch_size_max,
#: consume_concurrently_max_span as max_scan_units).
PULL_MSGS, PULL_UNITS = 256, 2000
#: Properties the SDK adds to every message (an example UNIQ_KEY; WAIT as the producer sets it).
SDK_PROPS = {"UNIQ_KEY": "7F0000010A1B18B4AAC25E8A6A6C0000", "WAIT": "true"}
SQL = {f.name: f.expression for f in FILTERS if f.kind == "SQL92"}
TAG = next(f.expression for f in FILTERS if f.kind == "TAG")


def filter_data() -> ConsumerFilterManager:
    """The SQL92 groups' filter data, born long before the writes (every message gets their bitmaps)."""
    m = ConsumerFilterManager(None, bloom=BloomFilter(20, 32))
    for name, expr in SQL.items():
        m.register(TOPIC, name, expr, "SQL92", 1)
    for by_group in m.table.values():
        for d in by_group.values():
            d.born_time -= 10 * LIVE_MARGIN_MS * 1000
    m._changed()
    return m


def message_filter(m: ConsumerFilterManager, name: str, case: str) -> SelectorFilter:
    if name == "tag":
        return SelectorFilter(compile_selector("TAG", TAG)).for_pull()
    base = SelectorFilter(compile_selector("SQL92", SQL[name]))
    if case == "catchup":
        return base.for_pull(m.metrics_of(name, TOPIC))
    fd = m.get(TOPIC, name)
    assert fd is not None
    return base.for_pull(m.metrics_of(name, TOPIC), m.bloom, fd.bloom, fd.born_time + LIVE_MARGIN_MS)


def drain(store: MessageStore, mf: SelectorFilter) -> tuple[int, int, float]:
    """(matched, pulls, CPU seconds) of draining every queue."""
    c0 = time.process_time()
    matched, _scanned, pulls = pull_queues(store, mf, QUEUES, PULL_MSGS, PULL_UNITS)
    return matched, pulls, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100,000 messages instead of 1,000,000")
    ap.add_argument("--messages", type=int, help="override the message count")
    ap.add_argument("--rounds", type=int, default=5, help="drains of each kind, alternating (5)")
    args = ap.parse_args()
    n = args.messages or (100_000 if args.quick else 1_000_000)
    drains = [("tag", "")] + [(name, case) for name in SQL for case in ("before", "catchup")]
    tmp = Path(tempfile.mkdtemp(prefix="sluice-sparse-pull-"))
    out: dict = {"benchmark": "sparse_pull", "quick": args.quick, "messages": n, "queues": QUEUES,
                 "body_bytes": len(BODY), "pull": {"max_msgs": PULL_MSGS, "max_scan_units": PULL_UNITS},
                 "c_extension": C is not None, "rounds": args.rounds}
    try:
        m = filter_data()
        fill(tmp / "store", n, QUEUES, extra=SDK_PROPS, dispatcher=CalcBitmapDispatcher(m))
        store = MessageStore(tmp / "store", store_config())
        store.start()
        try:
            rows: dict[str, list[tuple[int, int, float]]] = {}
            for _ in range(args.rounds + 1):  # the first round maps the files' pages: not counted
                for name, case in drains:
                    rows.setdefault(f"{name} {case}".strip(), []).append(drain(store, message_filter(m, name, case)))
        finally:
            store.close()
        out["drains"] = {}
        for key, runs in rows.items():
            matched, pulls = runs[-1][0], runs[-1][1]
            cpu = statistics.median(r[2] for r in runs[1:])
            out["drains"][key] = {"matched": matched, "pulls": pulls,
                                  "cpu_us_per_pull": round(cpu / pulls * 1e6, 1),
                                  "cpu_us_per_matched": round(cpu / max(1, matched) * 1e6, 3),
                                  "matched_per_cpu_s": round(matched / cpu) if cpu > 0 else 0}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
