"""The whole-store check (MessageStore.check, `sluice store check`) streams: it finds what the check that
kept one parsed record per message found, in the same order, and its memory does not grow with the store."""
from __future__ import annotations

import random
import subprocess
import sys
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from store_testlib import msg, run_alone, small_config

from sluice.protocol import properties as P
from sluice.store import MessageStore, StoreConfig
from sluice.store import check as check_mod
from sluice.store.check import CheckReport
from sluice.store.commitlog import ParsedRecord
from sluice.store.consumequeue import PAD_SIZE
from sluice.store.dispatch import is_queued
from sluice.store.ext_files import ext_addresses_ok
from sluice.store.types import Problem


def _ref_check(store: MessageStore) -> CheckReport:
    """The check as it was before streaming (commit 5cb6365, store/recovery.py Recovery.check), the reference."""
    r = store.recovery
    cl, queues, ext, index = r.commitlog, r.queues, r.ext, r.index
    rep = CheckReport()
    by_phys: dict[int, ParsedRecord] = {}
    per_queue: dict[tuple[str, int], list[ParsedRecord]] = defaultdict(list)

    def on_record(rec: ParsedRecord) -> None:
        by_phys[rec.physical_offset] = rec
        if is_queued(rec.sysflag):
            per_queue[(rec.topic, rec.queue_id)].append(rec)

    damaged: set[int] = set()
    pos = cl.min_offset
    while pos < cl.write_pos:
        end, err = cl.scan(pos, check_crc=True, on_record=on_record)
        if err is None:
            break
        rep.problems.append(Problem(err.path or "commitlog", err.offset or 0, str(err).split(" (")[0]))
        damaged.add(end)
        f = cl.queue.find(end)
        if f is None:
            break
        data = cl.read_record_unchecked(end)
        if data is not None and str(err).startswith("body CRC mismatch"):
            pos = end + len(data)
        else:
            pos = f.end
    rep.records = len(by_phys)
    for (topic, qid), recs in per_queue.items():
        cq = queues.get(topic, qid)
        live = [x for x in recs if x.queue_offset >= (cq.min_offset if cq else 0)]
        if cq is None:
            if live:
                rep.problems.append(Problem(f"consumequeue/{topic}/{qid}", 0, "queue missing for stored records"))
            continue
        for x in live:
            u = cq.unit(x.queue_offset)
            if u is None or u[0] != x.physical_offset or u[1] != x.total_size:
                rep.problems.append(Problem(f"consumequeue/{topic}/{qid}", x.queue_offset * 20,
                                            f"unit {x.queue_offset} does not point at its record "
                                            f"{x.physical_offset} ({u})"))
                break
    for cq in queues.all():
        units = cq.get_units(cq.min_offset, cq.max_offset - cq.min_offset)
        if units is None:
            continue
        rep.units += len(units)
        for i in np.flatnonzero((units["size"] > 0) & (units["size"] != PAD_SIZE)):
            phys = int(units["offset"][i])
            rec = by_phys.get(phys)
            qoff = cq.min_offset + int(i)
            if phys < cl.min_offset or phys in damaged:
                continue
            if rec is None or rec.topic != cq.topic or rec.queue_id != cq.queue_id or rec.queue_offset != qoff:
                rep.problems.append(Problem(f"consumequeue/{cq.topic}/{cq.queue_id}", qoff * 20,
                                            f"unit {qoff} points at {phys}, not a record of this queue"))
                break
    for cq in queues.all():
        bad_ext = ext_addresses_ok(cq, ext.get(cq.topic, cq.queue_id))
        if bad_ext is not None:
            rep.problems.append(Problem(f"consumequeue/{cq.topic}/{cq.queue_id}", bad_ext[0] * 20,
                                        f"unit {bad_ext[0]} holds ext address {bad_ext[1]}, which does not "
                                        "resolve to a ConsumeQueueExt unit"))
    if index is not None:
        top = index.max_indexed_offset()
        for rec in by_phys.values():
            if rec.physical_offset > top:
                continue
            props = P.decode_properties(rec.properties)
            key = props.get(P.UNIQ_KEY) or next(iter(P.split_keys(props.get(P.KEYS))), None)
            if key and rec.physical_offset not in index.query_offsets(rec.topic, key, 1 << 16, 0, 1 << 62):
                rep.problems.append(Problem("index", rec.physical_offset, f"key {key!r} of {rec.topic} not indexed"))
                break
    return rep


def _fill(d: Path, rng: random.Random) -> list:
    res = []
    with MessageStore(d, small_config()) as s:
        for i in range(rng.randint(20, 160)):
            props = {"KEYS": f"k{i}"} if rng.random() < 0.7 else {}
            if rng.random() < 0.3:
                props["UNIQ_KEY"] = f"U{i}"
            m = msg(rng.choice(["A", "B"]), b"p%d" % i + b"." * rng.randint(0, 3000), rng.randint(0, 2), **props)
            if rng.random() < 0.05:
                m.sysflag = 4  # a prepared transaction record: stored, never queued
            res.append(s.put_message(m))
    return res


def _damage(d: Path, res: list, rng: random.Random) -> None:
    seg = d / "commitlog" / ("0" * 20)
    for _ in range(rng.randint(1, 3)):
        cqs = sorted(p for p in (d / "consumequeue").rglob("*") if p.is_file())
        kind = rng.choice(["log", "unit", "unit_swap", "unit_zero", "cq_gone", "queue_gone", "index"])
        if kind == "log":
            r = rng.choice(res)
            with open(seg, "r+b") as f:
                f.seek(r.commitlog_offset + rng.choice([0, 4, 20, 90, r.size - 1]))
                f.write(bytes([rng.randrange(256)]))
        elif kind.startswith("unit") and cqs:
            p = rng.choice(cqs)
            raw = bytearray(p.read_bytes())
            n = len(raw) // 20
            at = rng.randrange(max(1, n)) * 20
            if kind == "unit":
                raw[at:at + 8] = rng.choice(res).commitlog_offset.to_bytes(8, "big")
            elif kind == "unit_swap" and n > 1:
                b = rng.randrange(n) * 20
                raw[at:at + 20], raw[b:b + 20] = raw[b:b + 20], raw[at:at + 20]
            else:
                raw[at:at + 20] = bytes(20)
            p.write_bytes(bytes(raw))
        elif kind == "cq_gone" and cqs:
            rng.choice(cqs).unlink()
        elif kind == "queue_gone":
            for p in (d / "consumequeue" / rng.choice("AB")).glob("*/*"):
                p.unlink()
        elif kind == "index":
            for p in (d / "index").iterdir():
                raw = bytearray(p.read_bytes())
                slots = np.frombuffer(bytes(raw[40:40 + 512 * 4]), dtype=">i4")
                used = np.flatnonzero(slots)
                if len(used):  # a hash slot lost: that slot's keys are not found
                    at = 40 + int(rng.choice(list(used))) * 4
                    raw[at:at + 4] = bytes(4)
                p.write_bytes(bytes(raw))


@pytest.mark.parametrize("seed", range(40))
def test_streamed_check_finds_what_the_check_of_every_record_found(tmp_path: Path, seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    d = tmp_path / "store"
    res = _fill(d, rng)
    _damage(d, res, rng)
    monkeypatch.setattr(check_mod, "_PENDING_MAX", rng.choice([1, 3, 50]))
    monkeypatch.setattr(check_mod, "_UNIT_WINDOW", rng.choice([1, 5, 64]))
    s = MessageStore(d, small_config()).start()
    try:
        s.wait_dispatched()
        expected = _ref_check(s)
        got = s.check()
    finally:
        s.close()
    assert got.problems == expected.problems
    assert (got.records, got.units) == (expected.records, expected.units)


def test_a_unit_pointing_at_another_queues_record_is_found_and_fixed(tmp_path: Path) -> None:
    d = tmp_path / "store"
    with MessageStore(d, small_config()) as s:
        a = [s.put_message(msg("A", b"a%d" % i)) for i in range(5)]
        b = s.put_message(msg("B", b"b"))
    p = d / "consumequeue" / "A" / "0" / ("0" * 20)
    raw = bytearray(p.read_bytes())
    raw[2 * 20:2 * 20 + 8] = b.commitlog_offset.to_bytes(8, "big")
    p.write_bytes(bytes(raw))
    s = MessageStore(d, small_config()).start()
    try:
        rep = s.check(fix=True)
        assert [(x.path, x.offset) for x in rep.problems] == [("consumequeue/A/0", 40)] * 2
        assert rep.problems[0].message.startswith(f"unit 2 does not point at its record {a[2].commitlog_offset} (")
        assert rep.problems[1].message == f"unit 2 points at {b.commitlog_offset}, not a record of this queue"
        assert rep.fixed == ["rebuilt consume queue A/0"]
        assert s.check().ok
    finally:
        s.close()


def _units(s: MessageStore, topic: str) -> list[tuple[int, int]]:
    cq = s.queues.get(topic, 0)
    u = cq.get_units(cq.min_offset, cq.max_offset - cq.min_offset)
    return [(int(o), int(z)) for o, z in zip(u["offset"], u["size"])]


def test_rebuild_in_batches_writes_what_one_batch_wrote(tmp_path: Path, monkeypatch) -> None:
    d = tmp_path / "store"
    monkeypatch.setattr(check_mod, "_REBUILD_BATCH", 7)
    with MessageStore(d, small_config()) as s:
        for i in range(50):
            s.put_message(msg("T", b"m%d" % i, TAGS=f"t{i % 3}"))
            s.put_message(msg("U", b"u%d" % i))
        s.wait_dispatched()
        before = s.queues.get("T", 0).get_units(0, 50).copy()
        s.rebuild_queue("T", 0)
        after = s.queues.get("T", 0)
        assert (after.min_offset, after.max_offset) == (0, 50)
        assert after.get_units(0, 50).tobytes() == before.tobytes()  # offsets, sizes, tag codes
        assert s.check().ok


def test_rebuild_of_records_out_of_queue_order_collects_them_all(tmp_path: Path, monkeypatch) -> None:
    # Record 2 of the queue says it is at queue offset 9 (its CRC covers the body only): after two
    # records written in a batch the rebuild starts over, collecting all, and writes them sorted.
    d = tmp_path / "store"
    monkeypatch.setattr(check_mod, "_REBUILD_BATCH", 2)
    with MessageStore(d, small_config()) as s:
        res = [s.put_message(msg("T", b"m%d" % i)) for i in range(8)]
    with open(d / "commitlog" / ("0" * 20), "r+b") as f:
        f.seek(res[2].commitlog_offset + 20)  # QUEUEOFFSET
        f.write((9).to_bytes(8, "big"))
    with MessageStore(d, small_config()) as s:
        s.rebuild_queue("T", 0)
        cq = s.queues.get("T", 0)
        assert (cq.min_offset, cq.max_offset) == (0, 10)
        got = _units(s, "T")
        want = [(r.commitlog_offset, r.size) for r in res]
        assert got[:2] == want[:2] and got[3:8] == want[3:8] and got[9] == want[2]
        assert got[2][1] == PAD_SIZE and got[8][1] == PAD_SIZE  # the holes padded, as before


# -- memory -----------------------------------------------------------------------------------------------

def _big_store(d: Path, n: int) -> None:
    cfg = StoreConfig(commitlog_file_size=64 << 20, consumequeue_units_per_file=300_000,
                      index_max_hash_slots=100_000, index_max_index_num=2 * n + 10, flush_interval_ms=50,
                      retention_check_interval_s=3600.0)
    with MessageStore(d, cfg) as s:
        for a in range(0, n, 2000):
            for q in range(4):
                s.put_messages([msg("Big", b"m%d" % i, q, KEYS=f"key-{i}") for i in range(a + q, min(n, a + 2000), 4)],
                               wait_durable=False)
        s.wait_dispatched(60)


def _check_peak(d: Path, n: int) -> tuple[int, CheckReport, int]:
    """Traced peaks of check() and of rebuilding queue Big/0 (``store check --fix``'s repair)."""
    cfg = StoreConfig(commitlog_file_size=64 << 20, consumequeue_units_per_file=300_000,
                      index_max_hash_slots=100_000, index_max_index_num=2 * n + 10)
    s = MessageStore(d, cfg).start()
    try:
        tracemalloc.start()
        try:
            rep = s.check()
            peak = tracemalloc.get_traced_memory()[1]
            before = s.queues.get("Big", 0).get_units(0, n).copy()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            s.rebuild_queue("Big", 0)
            rebuild_peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert np.array_equal(s.queues.get("Big", 0).get_units(0, n), before)
    finally:
        s.close()
    return peak, rep, rebuild_peak


def _check_peak_json(d: str, n: str) -> list[Any]:
    """:func:`_check_peak` for run_alone: (peak, ok, records, units, rebuild peak, the first problems)."""
    peak, rep, rebuild = _check_peak(Path(d), int(n))
    return [peak, rep.ok, rep.records, rep.units, rebuild, [str(p) for p in rep.problems[:3]]]


@pytest.mark.slow
def test_check_memory_does_not_grow_with_the_store(tmp_path: Path) -> None:
    peaks, rebuilds = {}, {}
    # 100,000 fills the units window and the batches; each check runs under tracemalloc at ~0.2 ms per
    # message, so the second size is 200,000: growth of 50 bytes a message would already break the bound.
    for n in (100_000, 200_000):
        d = tmp_path / str(n)
        _big_store(d, n)
        peak, ok, records, units, rebuild, problems = run_alone("test_check_bounded", "_check_peak_json",
                                                                  str(d), str(n))
        assert ok and records == n and units == n, problems
        peaks[n], rebuilds[n] = peak, rebuild
        print(f"{n} messages: check peak {peak / 2**20:.1f} MiB, rebuild of a queue {rebuild / 2**20:.1f} MiB")
    # Keeping a parsed record per message took ~300 bytes each (149 MiB at 400,000 messages); the units
    # window and the batches fill up to their sizes, then stay there (16.7, 17.3 and 18.8 MiB at 100,000,
    # 200,000 and 400,000 messages, 2026-11-29).
    assert peaks[200_000] <= 48 * 2**20
    assert peaks[200_000] <= peaks[100_000] + 4 * 2**20
    # The rebuild collected a request and its properties per message of the queue; now the log walk's
    # window (8 MiB, copied) and one batch of requests.
    assert rebuilds[200_000] <= 32 * 2**20
    assert rebuilds[200_000] <= rebuilds[100_000] + 2 * 2**20


@pytest.mark.slow
def test_store_check_command_peak_resident_set_is_bounded(tmp_path: Path) -> None:
    # 1,000,000 messages: keeping a parsed record per message took ~370 MiB of heap here. The command's
    # whole process (interpreter, numpy, its mappings of the log, queues and index) stays well under.
    n = 1_000_000
    d = tmp_path / "store"
    _big_store(d, n)
    probe = ("import resource, subprocess, sys; "
             "r = subprocess.run([sys.executable, '-m', 'sluice', 'store', 'check', '--json', sys.argv[1]], "
             "capture_output=True, text=True); "
             "print(r.returncode); print(r.stdout.strip().splitlines()[-1]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, str(d)], capture_output=True, text=True, timeout=600)
    code, report, maxrss_kib = out.stdout.strip().splitlines()[-3:]
    rep = orjson.loads(report)
    assert code == "0" and rep["ok"] and rep["records"] == n and rep["units"] == n, out.stderr[-2000:]
    print(f"store check of {n} messages: peak RSS {int(maxrss_kib) / 1024:.0f} MiB")
    assert int(maxrss_kib) * 1024 <= 200 * 2**20
