"""Catch-up filtered drains: a group that subscribes after the messages were written (no bitmaps).

One topic of N 1 KiB messages with the common workload's properties (issue 15): ``region`` (10 values),
``a`` (0..99, as text) and a tag (TagA..TagJ), written to ``--queues`` queues (4, as ``sluice bench``'s
topic) in runs of 32 (its send_batch size), so a queue's records lie apart in the commit log between
the other queues' runs as they do in the broker: with one queue the records are contiguous and the
hardware prefetcher hides what a broker's scan waits for. The store is driven in-process with the
broker's pull filter (broker/filtering.py SelectorFilter, no Bloom data), so every scanned record is
evaluated at pull time. Per selector: matched msgs/s and CPU microseconds per scanned record
(time.process_time, the pull loop only; the first drain of a store also maps its pages, which a
broker serving what it wrote does not), each queue drained in pulls of 32 as the push consumer asks.

    .venv/bin/python benchmarks/catchup_pull.py [--quick] [--messages N] [--queues Q] [--store DIR] [--per-record]

--quick uses 100,000 messages instead of 1,000,000. --store keeps (and reuses) the written store there
(written with the same --queues).
--per-record forces the Python record-by-record evaluation (the path before speedups.scan_records), for a
comparison in one process. --broker adds the same catch-up drains through a real namesrv and broker
(subprocesses, ``--flush async``) and the SDK push consumer (batches of 32 to the listener), the common
workload's messages sent as ``sluice bench`` sends them, with the CPU the broker and this process spent
per matched message. Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice.broker.filtering import SelectorFilter
from sluice.filter import compile_selector
from sluice.speedups import C
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.types import GetMessageStatus as S

TOPIC = "Catchup"
BODY = b"x" * 1024
REGIONS = ["eu", "us", "ap", "sa", "af", "me", "oc", "ca", "cn", "in"]
SELECTORS = {
    "region_10pct": ("SQL92", "region = 'eu'"),
    "sql92_5pct": ("SQL92", "region = 'eu' AND a >= 50"),
    "tags_sql_10pct": ("SQL92", "TAGS = 'TagA'"),
}


def store_config() -> StoreConfig:
    return StoreConfig(commitlog_file_size=256 * 1024 * 1024, index_enable=False, checkpoint_interval_ms=1000)


#: Records one put writes to one queue (sluice bench's send_batch of 32); queues take turns.
RUN = 32


def fill(root: Path, n: int, queues: int, *, extra: dict[str, str] | None = None,
         dispatcher: Any = None) -> None:
    """n messages to ``queues`` queues in runs of RUN, each with ``extra`` properties too; ``dispatcher`` (a
    bitmap dispatcher, say) sees them as the broker's dispatch would."""
    rng = random.Random(15)
    store = MessageStore(root, store_config())
    if dispatcher is not None:
        store.add_dispatcher(dispatcher)
    store.start()
    try:
        for k, i in enumerate(range(0, n, RUN)):
            store.put_messages([StoreMessage(TOPIC, BODY, k % queues, {
                **(extra or {}), "TAGS": f"Tag{'ABCDEFGHIJ'[rng.randrange(10)]}", "region": rng.choice(REGIONS),
                "a": str(rng.randrange(100))}) for _ in range(i, min(n, i + RUN))])
        store.wait_dispatched(600)
    finally:
        store.close()


def pull_queues(store: MessageStore, mf: Any, queues: int, max_msgs: int = 32,
                scan_units: int = 0) -> tuple[int, int, int]:
    """(matched, units scanned, pulls) of pulling every queue from offset 0 to its end through ``mf``; a pull
    answered anything but FOUND or NO_MATCHED_MESSAGE is an error (a drain cut short would read as fast)."""
    matched = scanned = pulls = 0
    for q in range(queues):
        end, off = store.get_max_offset(TOPIC, q), 0
        while off < end:
            res = store.get_messages(TOPIC, q, off, max_msgs, mf, None, scan_units)
            pulls += 1
            if res.status is S.FOUND:
                matched += res.message_count
            elif res.status is not S.NO_MATCHED_MESSAGE:
                raise RuntimeError(f"queue {q} offset {off}: {res.status.name}")
            off = res.next_begin_offset
        scanned += off
    return matched, scanned, pulls


def drain(root: Path, expression: str, queues: int) -> dict:
    store = MessageStore(root, store_config())
    store.start()
    try:
        mf = SelectorFilter(compile_selector("SQL92", expression)).for_pull()
        c0, t0 = time.process_time(), time.perf_counter()
        matched, scanned, pulls = pull_queues(store, mf, queues)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        return {"matched": matched, "scanned": scanned, "pulls": pulls,
                "cpu_us_per_scanned": round(cpu / max(1, scanned) * 1e6, 3),
                "matched_per_cpu_s": round(matched / cpu), "matched_per_s": round(matched / wall)}
    finally:
        store.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (Linux /proc)."""
    import os
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_drains(tmp: Path, n: int) -> dict:
    """Catch-up drains of the common workload through a broker subprocess and the SDK push consumer."""
    from sluice.bench.sluice_runner import cluster, create_topic, produce, push, wait_visible
    from sluice.bench.workload import FILTERS, Counter, Workload, expected_counts, generate, settle_heap
    from sluice.client import ConsumeResult

    wl = Workload(messages=n)
    props = generate(n, wl.seed)
    expected = expected_counts(props)
    settle_heap()  # as sluice bench does: no full collection of the workload inside a drain
    ns, broker = cluster(tmp, "async")
    out: dict = {"messages": n}
    try:
        create_topic(ns.addr)
        out["produce_msgs_per_s"] = round(produce(ns.addr, props, wl))
        wait_visible(ns.addr, n + 1, wl.drain_timeout)
        for f in FILTERS:
            if f.kind != "SQL92":
                continue
            counter = Counter(expected[f.name])

            def listener(msgs: list, counter: Counter = counter) -> ConsumeResult:
                counter.add(len(msgs))
                return ConsumeResult.SUCCESS
            b0, c0, t0 = cpu_seconds(broker.pid), time.process_time(), time.perf_counter()
            c = push(f"catchup-{f.name}", ns.addr, f, listener, consume_message_batch_max_size=32)
            try:
                done = counter.wait(wl.drain_timeout)
            finally:
                c.shutdown()
            row = counter.rate(t0)
            matched = max(1, counter.count)
            row["broker_cpu_us_per_matched"] = round((cpu_seconds(broker.pid) - b0) / matched * 1e6, 2)
            row["client_cpu_us_per_matched"] = round((time.process_time() - c0) / matched * 1e6, 2)
            if not done:
                row["error"] = f"drained {counter.count} of {counter.target}"
            out[f"{f.name} ({f.expression})"] = row
    finally:
        broker.stop()
        ns.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="100,000 messages instead of 1,000,000")
    ap.add_argument("--messages", type=int, help="override the message count")
    ap.add_argument("--queues", type=int, default=4, help="queues the messages go to, in runs of 32 (4)")
    ap.add_argument("--store", type=Path, help="keep the written store here and reuse it when present")
    ap.add_argument("--per-record", action="store_true", help="evaluate record by record (the Python path)")
    ap.add_argument("--broker", action="store_true", help="also drain through a broker and the push consumer")
    args = ap.parse_args()
    n = args.messages or (100_000 if args.quick else 1_000_000)
    if args.queues < 1:
        ap.error(f"--queues must be at least 1, got {args.queues}")
    if args.per_record:
        from sluice.store import pull_read
        pull_read.C = None  # the module's own switch: no C for pulls (gather_units nor scan_records)
    tmp = None
    root = args.store
    if root is None:
        tmp = Path(tempfile.mkdtemp(prefix="sluice-catchup-"))
        root = tmp / "store"
    out: dict = {"benchmark": "catchup_pull", "quick": args.quick, "messages": n, "queues": args.queues,
                 "body_bytes": len(BODY),
                 "c_extension": C is not None and not args.per_record}
    try:
        if not (root / "commitlog").exists():
            fill(root, n, args.queues)
        out["drains"] = {name: drain(root, expr, args.queues) for name, (_, expr) in SELECTORS.items()}
        if args.broker:
            work = Path(tempfile.mkdtemp(prefix="sluice-catchup-broker-"))
            try:
                out["broker"] = broker_drains(work, n)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
