"""Where a filtered drain's time goes: the common workload's drains (``sluice bench``, issue 15) with their phases.

A namesrv and broker (subprocesses, ``--flush async``) get the workload's messages (1 KiB, tag TagA..TagJ,
``region`` of 10 values, ``a`` 0..99) from the SDK producer as ``sluice bench`` sends them; then, per round,
filter and case, a new push consumer drains its matches (batches of 32 to a listener that checks each
message, as the bench's does): ``before`` groups subscribed before the writes (bitmaps), ``catchup`` groups
subscribe afterwards (pull-time evaluation). Per drain:

* ``matched_per_s``: matched messages from the consumer's start to the last delivery (the bench's figure);
* the phases, in ms from the start: ``start_ms`` (start() returned: joined, route, heartbeat),
  ``first_pull_ms`` (rebalanced, start offsets known), ``first_found_ms``, ``first_delivery_ms``, ``last_ms``;
* ``pulls`` and the queue offsets one pull moved on by (``units_per_pull``), answers without a match,
  flow-control waits, and the request round trips before the first pull (``start_rpcs``);
* CPU per matched message of this process (the consumer) and of the broker (all its threads, schedstat),
  the broker's split into what the consumer's start() cost it (``broker_start_cpu_ms``: join, heartbeat,
  routes) and the drain after it (``broker_drain_cpu_us_per_msg``: the pulls).

The consumer's methods are wrapped to time them; nothing else changes. The machine's load makes wall
figures vary: compare CPU per message, and rates over several rounds, alternating trees.

    .venv/bin/python benchmarks/drain_phases.py [--quick] [--rounds N] [--filters tag,region,sql92]

--quick uses 20,000 messages instead of 100,000. Last line: one JSON object (medians per filter and case).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice.bench import sluice_runner as R
from sluice.bench.workload import (
    FILTERS, Counter, Filter, Props, Workload, expected_counts, generate, settle_heap,
)
from sluice.client import ConsumeResult
from sluice.client.push_consumer import AsyncPushConsumer
from sluice.protocol.codes import RequestCode
from sluice.transport.client import RemotingClient

PULLS: list[tuple[float, float, int, int, int]] = []  # (sent, answered, offset, next offset, messages)
RPCS: list[tuple[float, float, str]] = []
_pull_once = AsyncPushConsumer._pull_once
_invoke = RemotingClient.invoke


async def _timed_pull(self: AsyncPushConsumer, mq: Any, pq: Any, offset: int, size: int) -> Any:
    t0 = time.perf_counter()
    r = await _pull_once(self, mq, pq, offset, size)
    if not mq.topic.startswith("%"):
        PULLS.append((t0, time.perf_counter(), offset, r.next_begin_offset, len(r.msg_found_list or ())))
    return r


async def _timed_invoke(self: RemotingClient, addr: str, request: Any, timeout: float = 3.0) -> Any:
    t0 = time.perf_counter()
    try:
        return await _invoke(self, addr, request, timeout)
    finally:
        if request.code != RequestCode.PULL_MESSAGE:
            name = RequestCode(request.code).name if request.code in RequestCode._value2member_map_ else request.code
            RPCS.append((t0, time.perf_counter(), str(name)))


AsyncPushConsumer._pull_once = _timed_pull  # type: ignore[method-assign]
RemotingClient.invoke = _timed_invoke  # type: ignore[method-assign]


def cpu_seconds(pid: int) -> float:
    """CPU of every thread of ``pid`` (schedstat: nanoseconds, not clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except OSError:
            pass
    return total / 1e9


def drain(ns: str, broker_pid: int, group: str, f: Filter, expected: int, timeout: float) -> dict[str, Any]:
    counter = Counter(expected)
    wrong = [0]

    def listener(msgs: list[Any]) -> ConsumeResult:
        for m in msgs:  # the bench's own check (sluice_runner._drain)
            p = m.properties
            ok = m.tags == f.expression if f.kind == "TAG" else \
                f.matches(Props(m.tags or "", p.get("region", ""), int(p.get("a", "-1"))))
            wrong[0] += not ok
        counter.add(len(msgs))
        return ConsumeResult.SUCCESS

    PULLS.clear()
    RPCS.clear()
    c0, b0 = time.process_time(), cpu_seconds(broker_pid)
    started = time.perf_counter()
    c = R.push(group, ns, f, listener, consume_message_batch_max_size=R.DRAIN_BATCH)
    start_returned, bs = time.perf_counter(), cpu_seconds(broker_pid)
    try:
        done = counter.wait(timeout)
    finally:
        c1, b1 = time.process_time(), cpu_seconds(broker_pid)
        flow = c.async_consumer.flow_control_times
        c.shutdown()
    out: dict[str, Any] = counter.rate(started)
    pulls = [p for p in PULLS if p[0] <= counter.last]
    ms = lambda t: round((t - started) * 1e3, 1)  # noqa: E731
    first_pull = min((p[0] for p in pulls), default=started)
    n = max(1, counter.count)
    out.update(
        done=done and not wrong[0], start_ms=ms(start_returned), first_pull_ms=ms(first_pull),
        first_found_ms=ms(min((p[1] for p in pulls if p[4]), default=started)),
        first_delivery_ms=ms(counter.first), last_ms=ms(counter.last), pulls=len(pulls),
        units_per_pull=round(statistics.fmean(p[3] - p[2] for p in pulls), 1) if pulls else 0,
        empty_answers=sum(1 for p in pulls if not p[4]), flow_control_waits=flow,
        start_rpcs=[name for t0, _t1, name in RPCS if t0 < first_pull],
        client_cpu_us_per_msg=round((c1 - c0) / n * 1e6, 2), broker_cpu_us_per_msg=round((b1 - b0) / n * 1e6, 2),
        broker_start_cpu_ms=round((bs - b0) * 1e3, 2), broker_drain_cpu_us_per_msg=round((b1 - bs) / n * 1e6, 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--filters", default=",".join(f.name for f in FILTERS))
    a = ap.parse_args()
    wl = Workload.quick(a.messages) if a.quick else Workload(messages=a.messages or 100_000)
    props = generate(wl.messages, wl.seed)
    expected = expected_counts(props)
    settle_heap()  # as sluice bench does: a full collection of the workload fell inside a drain (35 ms)
    filters = [f for f in FILTERS if f.name in a.filters.split(",")]
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="drain-phases-") as tmp:
        ns, broker = R.cluster(Path(tmp), "async")
        try:
            R.create_topic(ns.addr)
            for r in range(a.rounds):  # one 'before' group per round and filter, subscribed before the writes
                for f in filters:
                    c = R.push(f"phases-before-{f.name}-{r}", ns.addr, f, lambda msgs: ConsumeResult.SUCCESS)
                    try:
                        R.wait_owned(c)
                    finally:
                        c.shutdown()
            time.sleep(R.LIVE_MARGIN_MS / 1000 + 0.2)
            R.produce(ns.addr, props, wl)
            R.wait_visible(ns.addr, wl.messages + 1, wl.drain_timeout)
            for r in range(a.rounds):
                for f in filters:
                    for case in ("before", "catchup"):
                        o = drain(ns.addr, broker.pid, f"phases-{case}-{f.name}-{r}", f, expected[f.name],
                                  wl.drain_timeout)
                        rows.setdefault(f"{f.name} {case}", []).append(o)
                        print(json.dumps({"drain": f"{f.name} {case}", "round": r, **o}), flush=True)
        finally:
            broker.stop()
            ns.stop()
    med = statistics.median
    summary = {k: {"matched_per_s": med(o["matched_per_s"] for o in v),
                   "max_matched_per_s": max(o["matched_per_s"] for o in v),
                   "first_pull_ms": med(o["first_pull_ms"] for o in v), "pulls": med(o["pulls"] for o in v),
                   "client_cpu_us_per_msg": med(o["client_cpu_us_per_msg"] for o in v),
                   "broker_cpu_us_per_msg": med(o["broker_cpu_us_per_msg"] for o in v),
                   "broker_drain_cpu_us_per_msg": med(o["broker_drain_cpu_us_per_msg"] for o in v),
                   "all_done": all(o["done"] for o in v)} for k, v in rows.items()}
    print(json.dumps({"messages": wl.messages, "rounds": a.rounds, "load_average": os.getloadavg(),
                      "drains": summary}))


if __name__ == "__main__":
    main()
