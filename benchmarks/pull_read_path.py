"""Client CPU of a pull answer's read path (issue 15's read->decoded and decoded->submitted stages).

A namesrv and an async-flush broker (``sluice`` subprocesses on 127.0.0.1) store the common workload's
messages (1 KiB body, tag TagA, properties ``region`` and ``a``); a pull consumer in this process pulls them
back, and the bytes of each pull answer, as the client's connection read them, are kept. Those real frames
are then fed, in this process and without the network, through what the push consumer runs for an answer on
its loop thread: ``RemotingConnection.buffer_updated`` (frame split, header JSON) -> the pull's waiter ->
``process_pull_response`` (records decoded, offsets set) -> ``ProcessQueue.put`` -> the consume service's
``submit`` (here a stand-in that keeps nothing: the hand-over to the consume threads is measured elsewhere,
benchmarks/latency_stages.py).

* ``warm``: answers back to back, CPU per answer (process_time);
* ``paced``: one answer every ``--gap`` ms, as at 1,000 msgs/s, where caches are cold: the median
  perf_counter time per answer (indicative only on a shared machine).

Run: .venv/bin/python benchmarks/pull_read_path.py [--quick] [--gap 1.0]
Prints one JSON object on its last line: per answer size (1 and 32 messages), microseconds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import SluiceProcess, wait_for_route  # noqa: E402

from sluice import AsyncProducer, Message, MessageSelector  # noqa: E402
from sluice.client import push_consumer as pc_mod  # noqa: E402
from sluice.client.process_queue import ProcessQueue  # noqa: E402
from sluice.client.pull_consumer import AsyncPullConsumer  # noqa: E402
from sluice.transport import connection as conn_mod  # noqa: E402

TOPIC = "BenchReadPath"
SELECTOR = MessageSelector.by_sql("region = 'eu'")


async def capture(ns: str, sizes: tuple[int, ...]) -> dict[int, bytes]:
    """One real pull answer frame per size, as read by the client's connection."""
    reads: list[bytes] = []
    original = conn_mod.RemotingConnection.buffer_updated

    def keep(self: Any, n: int) -> None:
        reads.append(bytes(conn_mod._reads.view[:n]))
        original(self, n)

    p = AsyncProducer("bench-read-path-p", ns)
    await p.start()
    c = AsyncPullConsumer("bench-read-path-c", ns)
    try:
        msgs = [Message(TOPIC, b"x" * 1024, tags="TagA", properties={"region": "eu", "a": str(i)})
                for i in range(max(sizes))]
        first = await p.send_batch(msgs)  # one queue, consecutive offsets
        await c.start()
        out: dict[int, bytes] = {}
        conn_mod.RemotingConnection.buffer_updated = keep  # type: ignore[method-assign]
        try:
            for size in sizes:
                reads.clear()
                r = await c.pull(first.queue, SELECTOR, first.queue_offset, size)
                if len(r.msg_found_list) != size:
                    raise RuntimeError(f"pulled {len(r.msg_found_list)} messages, wanted {size}")
                out[size] = b"".join(reads)
        finally:
            conn_mod.RemotingConnection.buffer_updated = original  # type: ignore[method-assign]
        return out
    finally:
        await c.shutdown()
        await p.shutdown()


class _Service:
    """The consume service's place: takes the messages and keeps nothing."""

    def submit(self, mq: Any, pq: Any, msgs: list[Any]) -> None:
        pass


def measure(frame: bytes, expect: int, n: int, gap: float) -> dict[str, float]:
    async def run() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        consumer = pc_mod.AsyncPushConsumer("bench-read-path", "127.0.0.1:1")
        consumer.service = _Service()  # type: ignore[assignment]
        conn = conn_mod.RemotingConnection()
        view = conn.get_buffer(len(frame))
        view[:len(frame)] = frame
        opaque = int(frame[8:].split(b'"opaque":', 1)[1].split(b",", 1)[0])

        def once() -> None:
            fut = loop.create_future()
            conn._pending[opaque] = (pc_mod._PullWaiter(consumer, None, ProcessQueue(), SELECTOR, fut),  # type: ignore[arg-type]
                                     0.0, 11, None)
            conn.buffer_updated(len(frame))
            if len(fut.result().msg_found_list) != expect:
                raise RuntimeError("the answer did not decode to its messages")

        for _ in range(n // 10):
            once()
        runs = []
        for _ in range(5):
            c0 = time.process_time()
            for _ in range(n):
                once()
            runs.append((time.process_time() - c0) / n * 1e6)
        paced = []
        now = time.perf_counter_ns
        for _ in range(max(200, n // 20)):
            time.sleep(gap)
            t0 = now()
            once()
            paced.append((now() - t0) / 1000)
        return {"warm_cpu_us": round(statistics.median(runs), 2),
                "warm_cpu_us_per_msg": round(statistics.median(runs) / expect, 2),
                "paced_p50_us": round(statistics.median(paced), 1)}
    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--gap", type=float, default=1.0, help="ms between paced answers")
    args = ap.parse_args()
    sizes = (1, 32)
    with tempfile.TemporaryDirectory(prefix="sluice-read-path-") as tmp:
        ns = SluiceProcess.start(["namesrv"], Path(tmp), name="namesrv")
        try:
            broker = SluiceProcess.start(["broker", "--namesrv", ns.addr, "--store", str(Path(tmp) / "store"),
                                          "--flush", "async"], Path(tmp), name="broker")
            try:
                wait_for_route(ns.addr, "TBW102")
                frames = asyncio.run(capture(ns.addr, sizes))
            finally:
                broker.stop()
        finally:
            ns.stop()
    n = 2000 if args.quick else 20000
    out: dict[str, Any] = {"quick": args.quick, "gap_ms": args.gap}
    for size in sizes:
        r = measure(frames[size], size, n if size == 1 else max(200, n // 16), args.gap / 1000)
        out[f"answer_of_{size}"] = {"frame_bytes": len(frames[size]), **r}
        print(f"  answer of {size:>2} message(s), {len(frames[size])} bytes: warm {r['warm_cpu_us']:.2f} us CPU "
              f"({r['warm_cpu_us_per_msg']:.2f}/msg), paced p50 {r['paced_p50_us']:.1f} us", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
