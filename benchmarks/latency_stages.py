"""Where a matched message's send→listener latency goes on the client, stage by stage (issue 15's latency row).

The same run as benchmarks/latency.py (a namesrv and an async-flush broker as subprocesses; here a push consumer
on ``region = 'eu'`` and a producer ``send_async``-ing single 1 KiB messages paced at the rate), with timing hooks
wrapped around SDK functions by this script only (the product has none). Per matched message, perf_counter
times of: the send stamp, the producer starting the send (caller's thread, or the loop's when the send goes
through it), its bytes handed to the socket, the pull answer's bytes read on the loop, the pull answer decoded,
its messages submitted to the consume service, a consume thread starting the job, the listener seeing it. The
hooks cost a few microseconds each, so totals run a little above benchmarks/latency.py's.

Run: .venv/bin/python benchmarks/latency_stages.py [--quick] [--rate 1000] [--seconds S] [--inline]
Prints one JSON object on its last line: per stage the median, p90 and p99 in microseconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sluice.bench import workload as wl_mod  # noqa: E402
from sluice.bench.sluice_runner import cluster, create_topic, latency  # noqa: E402
from sluice.bench.workload import Workload, stamp_of  # noqa: E402
from sluice.client import consume_service as cs_mod  # noqa: E402
from sluice.client import producer as prod_mod  # noqa: E402
from sluice.client import push_consumer as pc_mod  # noqa: E402
from sluice.transport import blocking as blk_mod  # noqa: E402
from sluice.transport import connection as conn_mod  # noqa: E402

STAGES = ("started", "written", "read", "decoded", "submitted", "thread", "listener")
now = time.perf_counter_ns
marks: dict[int, dict[str, int]] = {}  # send stamp -> stage -> ns
_in_drain: list[bytes] = []  # bodies sent in the loop thread's current drain
_last_read = [0]


def _mark(body: bytes, stage: str, t: int) -> None:
    try:
        stamp = stamp_of(body)
    except ValueError:
        return
    if stamp > 0:
        marks.setdefault(stamp, {})[stage] = t


def install_hooks() -> None:
    """Wrap the SDK functions a message passes (this process only)."""
    AP, LT, RC, S = prod_mod.AsyncProducer, blk_mod.LoopThread, conn_mod.RemotingConnection, cs_mod._Service
    send_soon, drain, buffer_updated, pulled = AP.send_soon, LT._drain, RC.buffer_updated, pc_mod.process_pull_response
    from_thread = getattr(AP, "send_from_thread", None)
    start, call, seen = S._start, S._call, wl_mod.LatencyProbe.seen

    def send_soon_h(self: Any, msg: Any, fut: Any, **kw: Any) -> None:
        _mark(msg.body, "started", now())
        _in_drain.append(msg.body)
        send_soon(self, msg, fut, **kw)

    def drain_h(self: Any) -> None:
        drain(self)
        t = now()
        for body in _in_drain:
            _mark(body, "written", t)
        _in_drain.clear()

    def buffer_updated_h(self: Any, n: int) -> None:
        _last_read[0] = now()
        buffer_updated(self, n)

    def pulled_h(response: Any, sel: Any, **kw: Any) -> Any:
        result = pulled(response, sel, **kw)
        t = now()
        for m in result.msg_found_list:
            _mark(m.body, "read", _last_read[0])
            _mark(m.body, "decoded", t)
        return result

    def start_h(self: Any, pq: Any, batches: Any) -> Any:
        t = now()
        for b in batches:
            for m in b:
                _mark(m.body, "submitted", t)
        return start(self, pq, batches)

    def call_h(self: Any, pq: Any, batches: Any, gate: Any = None) -> Any:
        t = now()
        for b in batches:
            for m in b:
                _mark(m.body, "thread", t)
        return call(self, pq, batches, gate)

    def seen_h(self: Any, body: bytes) -> None:
        _mark(body, "listener", now())
        seen(self, body)

    AP.send_soon, LT._drain, RC.buffer_updated = send_soon_h, drain_h, buffer_updated_h
    pc_mod.process_pull_response = pulled_h
    S._start, S._call, wl_mod.LatencyProbe.seen = start_h, call_h, seen_h
    if from_thread is not None:
        def from_thread_h(self: Any, msg: Any, fut: Any, loop: Any, **kw: Any) -> bool:
            t = now()
            ok = from_thread(self, msg, fut, loop, **kw)
            if ok:
                _mark(msg.body, "started", t)
                _mark(msg.body, "written", now())
            return ok
        AP.send_from_thread = from_thread_h


def summary(skip_first: float = 0.2) -> dict[str, Any]:
    rows = sorted((s, d) for s, d in marks.items() if all(k in d for k in STAGES))
    rows = rows[int(len(rows) * skip_first):]  # the warm-up's
    out: dict[str, Any] = {"messages": len(rows), "stages_us": {}}
    if not rows:
        return out

    def q(vals: list[float], p: float) -> float:
        return round(vals[min(len(vals) - 1, int(len(vals) * p))], 1)
    prev = None
    for k in (*STAGES, "total"):
        key = k if k != "total" else "listener"
        vals = sorted((d[key] - (s if prev is None or k == "total" else d[prev])) / 1000 for s, d in rows)
        name = f"{prev or 'stamp'}->{k}" if k != "total" else "stamp->listener"
        out["stages_us"][name] = {"p50": q(vals, 0.5), "p90": q(vals, 0.9), "p99": q(vals, 0.99)}
        prev = k
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 s instead of 5 s")
    ap.add_argument("--rate", type=int, default=1000, help="msgs/s")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--inline", action="store_true",
                    help="the listener on the consumer's I/O thread (consume_inline): 'thread' is then the call")
    args = ap.parse_args()
    wl = Workload.quick() if args.quick else Workload()
    wl = replace(wl, latency_rates=(args.rate,),
                 latency_seconds=args.seconds if args.seconds is not None else wl.latency_seconds)
    install_hooks()
    with tempfile.TemporaryDirectory(prefix="sluice-stages-") as tmp:
        ns, broker = cluster(Path(tmp), "async")
        try:
            create_topic(ns.addr)
            [res] = latency(ns.addr, wl, warmup_seconds=1.0, inline=args.inline)
        finally:
            broker.stop()
            ns.stop()
    out = {"rate": args.rate, "quick": args.quick, "inline": args.inline, "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], **summary()}
    for name, v in out["stages_us"].items():
        print(f"  {name:<22} p50 {v['p50']:8.1f}  p90 {v['p90']:8.1f}  p99 {v['p99']:8.1f} us", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
