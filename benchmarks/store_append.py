"""Append throughput of the store against the raw sequential write rate of the same disk.

Cases (1 KiB bodies): single puts (1 and 64 writer threads) and 32-message batches
with asynchronous flush; synchronous flush with 1 and with 64 writer threads. Every message carries a tag,
its own KEYS value and its own UNIQ_KEY (as a producer sets them), so the key
index does its full work. A case's time runs until everything appended is
dispatched (consume queues and index written): a message is only useful then.

The raw baselines write the same bytes (the encoded records of the same
messages, as many per write as per put) with plain os.write, fdatasynced at the
same cadence (every flush interval for async, after every write for sync). For
64 synchronous writers the cadence is the group commit's: one fdatasync per
round, so its baseline writes as many records per write as a round held on
average, fdatasyncing after each write.

    .venv/bin/python benchmarks/store_append.py [--quick] [--profile CASE]

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from sluice.store import MessageStore, StoreConfig, StoreMessage

BODY = bytes(range(256)) * 4  # 1 KiB
TOPIC = "Bench"
POOL = 4096  # distinct messages in all writers' pools, cycled (distinct keys: no cache can shortcut the index)


def config(flush_mode: str) -> StoreConfig:
    return StoreConfig(commitlog_file_size=256 * 1024 * 1024, flush_mode=flush_mode, index_max_hash_slots=500_000,
                       index_max_index_num=2_000_000)


def message_pool(writer: int, batch: int, queue_id: int, size: int = POOL) -> list[list[StoreMessage]]:
    """Batches of distinct messages: tag, own KEYS (``order-<n>``) and a 32-hex UNIQ_KEY, like a producer's."""
    n_batches = max(1, size // batch)
    out = []
    for b in range(n_batches):
        out.append([StoreMessage(TOPIC, BODY, queue_id, {
            "TAGS": "TagA", "KEYS": f"order-{writer}-{b * batch + i}",
            "UNIQ_KEY": f"7F00000100{writer:04X}{b * batch + i:018X}"}) for i in range(batch)])
    return out


def encoded_chunks(batch: int) -> list[bytes]:
    """The bytes the store writes for the same messages: encoded records, ``batch`` per chunk."""
    from sluice.store.encode import encode_batch
    host = config("async").store_host
    return [bytes(encode_batch(msgs, store_host=host, max_body=4 << 20).buf) for msgs in message_pool(0, batch, 0)]


def raw_rate(root: Path, seconds: float, batch: int, fsync_every_s: float | None) -> dict[str, float]:
    """os.write the store's record bytes, ``batch`` records per write, to one file; fdatasync (as the store
    does) every ``fsync_every_s`` (None: after every write)."""
    chunks = encoded_chunks(batch)
    path = root / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = nbytes = i = 0
    start = last_sync = time.perf_counter()
    try:
        while (now := time.perf_counter()) - start < seconds:
            chunk = chunks[i]
            i = i + 1 if i + 1 < len(chunks) else 0
            os.write(fd, chunk)
            n += batch
            nbytes += len(chunk)
            if fsync_every_s is None or now - last_sync >= fsync_every_s:
                os.fdatasync(fd)
                last_sync = now
        os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    dt = time.perf_counter() - start
    return {"msgs_per_s": n / dt, "mb_per_s": nbytes / dt / 1e6}


def store_rate(root: Path, seconds: float, *, flush_mode: str, batch: int, threads: int,
               inline_dispatch: bool = False, profiler: cProfile.Profile | None = None) -> dict[str, float]:
    """Writers append for ``seconds``; the clock stops when everything appended is dispatched.

    ``inline_dispatch`` (profiling, one writer): the writer runs dispatch itself every 64 puts, so one
    thread's profile shows both halves of the work."""
    d = root / f"store-{flush_mode}-{batch}-{threads}"
    counts = [0] * threads
    stop = threading.Event()
    with MessageStore(d, config(flush_mode)) as s:
        if inline_dispatch:
            s.dispatch.stop()

        pools = [message_pool(i, batch, i % 8, max(batch, POOL // threads)) for i in range(threads)]

        def work(i: int) -> None:
            pool = pools[i]
            k = 0
            if profiler is not None and i == 0:
                profiler.enable()  # per thread: cProfile sees only the thread that enables it
            while not stop.is_set():
                msgs = pool[k]
                k = k + 1 if k + 1 < len(pool) else 0
                if batch == 1:
                    s.put_message(msgs[0])
                else:
                    s.put_messages(msgs)
                counts[i] += batch
                if inline_dispatch and k % 64 == 0:  # about the batches the dispatch thread sees
                    s.dispatch.reput()
            if inline_dispatch:
                s.dispatch.reput()
            if profiler is not None and i == 0:
                profiler.disable()

        ts = [threading.Thread(target=work, args=(i,), name=f"writer-{i}") for i in range(threads)]
        start = time.perf_counter()
        for t in ts:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join()
        appended = time.perf_counter() - start
        if not s.wait_dispatched(timeout=600):
            raise RuntimeError(f"dispatch did not catch up: {s.stats()}")
        dt = time.perf_counter() - start
        n = sum(counts)
        st = s.stats()
        if st["put_messages"] != n:
            raise RuntimeError(f"{n} puts counted, the store says {st['put_messages']}")
        nbytes = st["put_bytes"]
        fsyncs = s.flusher.fsyncs
    shutil.rmtree(d, ignore_errors=True)
    return {"msgs_per_s": n / dt, "mb_per_s": nbytes / dt / 1e6, "fsyncs": fsyncs, "messages": n,
            "dispatch_lag_s": round(dt - appended, 3)}


CASES = {
    "async_single": dict(flush_mode="async", batch=1, threads=1),
    "async_64_writers": dict(flush_mode="async", batch=1, threads=64),
    "async_batch32": dict(flush_mode="async", batch=32, threads=1),
    "sync_1_writer": dict(flush_mode="sync", batch=1, threads=1),
    "sync_64_writers": dict(flush_mode="sync", batch=1, threads=64),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 2 s per case")
    ap.add_argument("--profile", choices=sorted(CASES),
                    help="profile one case with cProfile (writer 0; with one writer, dispatch runs inline in it)")
    ap.add_argument("--dir", help="where to write (default: a temp dir under /tmp)")
    args = ap.parse_args()
    seconds = 2.0 if args.quick else 6.0
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-", dir=args.dir))
    try:
        if args.profile:
            prof = cProfile.Profile()
            kw = CASES[args.profile]
            r = store_rate(root, seconds, **kw, inline_dispatch=kw["threads"] == 1, profiler=prof)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
            print(json.dumps({args.profile: r}))
            return
        raw_async = raw_rate(root, seconds, 32, config("async").flush_interval_ms / 1000)
        raw_sync = raw_rate(root, seconds, 1, None)
        out: dict[str, object] = {"raw_async_cadence": raw_async, "raw_fsync_each_write": raw_sync}
        for name, r in out.items():
            print(f"{name:20s} {r['msgs_per_s']:>10.0f} msg/s {r['mb_per_s']:>8.1f} MB/s", file=sys.stderr)
        for name, kw in CASES.items():
            r = store_rate(root, seconds, **kw)
            base = raw_async if kw["flush_mode"] == "async" else raw_sync
            about_base = ""
            if kw["flush_mode"] == "sync" and kw["threads"] > 1:
                # Group commit fsyncs once per round of many puts: the raw baseline at that cadence
                # writes as many records per write as a round held, with an fdatasync after each write.
                per_fsync = max(1, round(r["messages"] / max(1, r["fsyncs"])))
                base = r["raw_same_cadence"] = raw_rate(root, seconds, per_fsync, None)
                about_base = f" (raw {base['msgs_per_s']:.0f} msg/s at {per_fsync} records per fsync)"
            r["ratio_to_raw"] = round(r["msgs_per_s"] / base["msgs_per_s"], 3)
            out[name] = r
            print(f"{name:20s} {r['msgs_per_s']:>10.0f} msg/s {r['mb_per_s']:>8.1f} MB/s "
                  f"ratio to raw {r['ratio_to_raw']:.3f}{about_base}", file=sys.stderr)
        out["goal_batch_async_vs_raw"] = round(out["async_batch32"]["msgs_per_s"] / raw_async["msgs_per_s"], 3)
        out["goal_sync64_vs_async_single"] = round(
            out["sync_64_writers"]["msgs_per_s"] / out["async_single"]["msgs_per_s"], 3)
        # The same 64 threads with asynchronous flush: what the fsyncs cost, apart from the cost of 64
        # Python threads sharing one GIL (which asynchronous flush pays too).
        out["sync64_vs_async64"] = round(
            out["sync_64_writers"]["msgs_per_s"] / out["async_64_writers"]["msgs_per_s"], 3)
        out["quick"] = args.quick
        print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
