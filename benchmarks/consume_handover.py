"""The push consumer's hand-over alone: submit of a pulled delivery on the event loop -> the listener running on
a consume thread (issue 15's latency row, the stages "submitted->thread->listener" of latency_stages.py).

In-process, no broker or sockets: a ConcurrentConsumeService with a listener that notes the time, fed single
1 KiB messages paced as at --rate msgs/s from the event loop, which after each submit runs --loop-work-us of
Python (the pull loop building its next pull) before it sleeps. Per delivery the time from submit to the
listener; the process's CPU per delivery.

Run: .venv/bin/python benchmarks/consume_handover.py [--quick] [--rate 1000] [--count N] [--loop-work-us 30]
Prints one JSON object on its last line: p50 / p90 / p99 in microseconds, CPU µs per delivery, hand-overs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from sluice.client.consume_service import ConcurrentConsumeService  # noqa: E402
from sluice.client.process_queue import ProcessQueue  # noqa: E402
from sluice.client.push_options import ConsumeResult, PushConsumerOptions  # noqa: E402
from sluice.client.results import MessageQueue  # noqa: E402
from sluice.message import MessageExt  # noqa: E402

now = time.perf_counter_ns


def _msg(offset: int) -> MessageExt:
    return MessageExt(topic="T", body=b"x" * 1024, properties={}, queue_id=0, queue_offset=offset,
                      commitlog_offset=0, msg_id=f"id{offset}", offset_msg_id="", sysflag=0, flag=0,
                      born_timestamp=0, born_host=("127.0.0.1", 0), store_timestamp=0,
                      store_host=("127.0.0.1", 1), reconsume_times=0, body_crc=0, store_size=0)


class _Offsets:
    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        pass


def _spin(us: float) -> None:
    end = now() + int(us * 1000)
    while now() < end:
        pass


async def run(count: int, rate: int, loop_work_us: float) -> dict:
    mq = MessageQueue(topic="T", broker_name="b", queue_id=0)
    pq = ProcessQueue()
    submitted: dict[int, int] = {}
    delays: list[float] = []

    def listener(msgs: list[MessageExt]) -> ConsumeResult:
        t = now()
        delays.append((t - submitted[msgs[0].queue_offset]) / 1000)
        return ConsumeResult.SUCCESS

    consumer = SimpleNamespace(group="bench", options=PushConsumerOptions(), offset_store=_Offsets(),
                               rebalancer=SimpleNamespace(process_queues={mq: pq}))
    service = ConcurrentConsumeService(consumer, listener)  # type: ignore[arg-type]
    msgs = [_msg(i) for i in range(count)]
    warm = count // 5
    period = 1 / rate
    cpu0 = 0.0
    start = time.perf_counter()
    for i, m in enumerate(msgs):
        if i == warm:
            cpu0 = time.process_time()
        fresh = pq.put([m])
        submitted[i] = now()
        service.submit(mq, pq, fresh)
        _spin(loop_work_us)
        await asyncio.sleep(max(0.0, start + (i + 1) * period - time.perf_counter()))
    await service.shutdown(30)
    cpu = time.process_time() - cpu0
    vals = sorted(delays[warm:])

    def q(p: float) -> float:
        return round(vals[min(len(vals) - 1, int(len(vals) * p))], 1)
    return {"rate": rate, "deliveries": len(vals), "loop_work_us": loop_work_us,
            "submit_to_listener_us": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)},
            "cpu_us_per_delivery": round(cpu / max(1, count - warm) * 1e6, 1),
            "handoffs": service.handoffs, "handoffs_late": service.handoffs_late}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 deliveries instead of 5,000")
    ap.add_argument("--rate", type=int, default=1000, help="deliveries per second")
    ap.add_argument("--count", type=int, default=None)
    ap.add_argument("--loop-work-us", type=float, default=30.0,
                    help="Python run on the loop after each submit (the pull loop's next pull)")
    args = ap.parse_args()
    count = args.count if args.count is not None else (1000 if args.quick else 5000)
    out = asyncio.run(run(count, args.rate, args.loop_work_us))
    v = out["submit_to_listener_us"]
    print(f"  submit->listener p50 {v['p50']} p90 {v['p90']} p99 {v['p99']} us, "
          f"cpu {out['cpu_us_per_delivery']} us/delivery", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
