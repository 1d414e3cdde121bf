"""Broker CPU per woken held pull (issue 15's latency row: the hold, the wake-up and the answer).

One broker (a ``sluice`` subprocess, async flush), one topic queue, one connection. Two cases, in alternating
blocks so drift and other load fall on both:

* ``held``: a pull with the SUSPEND flag at the queue's end, then a send on the same connection: the broker
  holds the pull, the send's dispatch wakes it, it is pulled again and answered (one message);
* ``direct``: the send first (its answer awaited), then the pull, answered at once.

Per case: broker CPU microseconds per cycle (all its threads, /proc schedstat) and the client's wall time per
cycle; ``held_extra_us`` is the held cycle's broker CPU beyond the direct one's (holding and waking).

Run: .venv/bin/python benchmarks/held_pull.py [--quick] [--cycles N] [--blocks B]
Prints one JSON object on its last line.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from produce_pull import TOPIC, check, cpu_seconds, send_request, start_server, stop_server  # noqa: E402
from sluice.protocol.codes import RequestCode  # noqa: E402
from sluice.protocol.command import RemotingCommand  # noqa: E402
from sluice.transport.client import RemotingClient  # noqa: E402

FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x2, 0x4


def pull_request(offset: int, suspend: bool) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(
        consumerGroup="HG", topic=TOPIC, queueId=0, queueOffset=offset, maxMsgNums=32,
        sysFlag=FLAG_SUBSCRIPTION | (FLAG_SUSPEND if suspend else 0), commitOffset=0,
        suspendTimeoutMillis=15_000, subVersion=0, subscription="*"))


async def cycles(conn, offset: int, n: int, held: bool) -> int:  # noqa: ANN001
    for _ in range(n):
        if held:
            pulled = conn.request_nowait(pull_request(offset, True), 30)
            sent = conn.request_nowait(send_request(0), 30)
            check(await sent)
            resp = await pulled
        else:
            check(await conn.request_nowait(send_request(0), 30))
            resp = await conn.request_nowait(pull_request(offset, False), 30)
        if resp.code != 0:
            raise RuntimeError(f"pull at {offset} answered {resp.code}: {resp.remark}")
        offset = int(resp.ext_fields["nextBeginOffset"])
    return offset


async def run(addr: str, pid: int, n: int, blocks: int) -> dict:
    client = RemotingClient()
    try:
        check(await client.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, dict(
            topic=TOPIC, readQueueNums=1, writeQueueNums=1, perm=6))))
        conn = await client.connection(addr)
        offset = await cycles(conn, 0, 200, True)  # warm up both paths
        offset = await cycles(conn, offset, 200, False)
        per: dict[str, list[float]] = {"held": [], "direct": []}
        wall: dict[str, list[float]] = {"held": [], "direct": []}
        for _ in range(blocks):
            for case in ("held", "direct"):
                c0, t0 = cpu_seconds(pid), time.perf_counter()
                offset = await cycles(conn, offset, n, case == "held")
                per[case].append((cpu_seconds(pid) - c0) / n * 1e6)
                wall[case].append((time.perf_counter() - t0) / n * 1e6)
    finally:
        await client.close()
    out: dict = {}
    for case in per:
        out[f"{case}_broker_cpu_us"] = round(statistics.median(per[case]), 1)
        out[f"{case}_broker_cpu_us_blocks"] = [round(x, 1) for x in per[case]]
        out[f"{case}_wall_us"] = round(statistics.median(wall[case]), 1)
    out["held_extra_us"] = round(out["held_broker_cpu_us"] - out["direct_broker_cpu_us"], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cycles")
    ap.add_argument("--cycles", type=int, default=None, help="cycles per block")
    ap.add_argument("--blocks", type=int, default=None, help="blocks per case")
    args = ap.parse_args()
    n = args.cycles or (500 if args.quick else 2000)
    blocks = args.blocks or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="sluice-held-") as tmp_s:
        tmp = Path(tmp_s)
        proc, addr = start_server(["broker", "--store", str(tmp / "store"), "--flush", "async"], tmp / "broker.log")
        try:
            res = asyncio.run(run(addr, proc.pid, n, blocks))
        finally:
            stop_server(proc)
    res.update(quick=args.quick, cycles_per_block=n, blocks=blocks)
    print(f"held {res['held_broker_cpu_us']} us  direct {res['direct_broker_cpu_us']} us broker CPU per cycle; "
          f"held extra {res['held_extra_us']} us", file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
