"""The broker's CPU per pull for a filtered pull a few units behind the queue's end: what a push consumer that
keeps up at 10,000 msgs/s sends after each delivered message (issue 15's latency row).

An in-process BrokerController, one connection through an in-memory transport (send_wake_path.py's), a group
on ``region = 'eu'`` whose bitmaps are built at dispatch; 400 single sends, every tenth ``eu``. Then, per
window of 1, 2 and 5 units before the queue's end, the same PULL_MESSAGE (SQL92 subscription flag, no
SUSPEND: answered at once) read many times; the process CPU per pull from the read of its frame to the write
of its answer, and the answers' codes.

Run: .venv/bin/python benchmarks/pull_few_path.py [--quick]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import send_wake_path as S  # noqa: E402

from sluice.broker.config import BrokerConfig  # noqa: E402
from sluice.broker.controller import BrokerController  # noqa: E402
from sluice.protocol.codes import RequestCode  # noqa: E402
from sluice.protocol.command import RemotingCommand  # noqa: E402

SENDS = 400


def _pull(offset: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(
        consumerGroup="G", topic=S.TOPIC, queueId=0, queueOffset=offset, maxMsgNums=32, sysFlag=0x4,
        commitOffset=0, suspendTimeoutMillis=60_000, subVersion=1, subscription="region = 'eu'",
        expressionType="SQL92"))


async def _run(root: str, pulls: int) -> dict[str, object]:
    broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:0", store=root + "/store"))
    await broker.start()
    out: dict[str, object] = {}
    try:
        conn, t = await S.connected_group(broker)
        await asyncio.sleep(1.2)  # past the live margin after which the broker trusts the group's bitmaps
        for i in range(1, SENDS + 1):
            conn.data_received(S._wire(S._send(i, "eu" if i % 10 == 0 else "us"), 100 + i))
        await asyncio.sleep(0.2)
        t.take()
        end = SENDS + 1
        for back in (1, 2, 5):
            frames = [S._wire(_pull(end - back), 1000 + j) for j in range(pulls)]
            for f in frames[:pulls // 10]:  # warm-up
                conn.data_received(f)
            t.take()
            c0 = time.process_time()
            for f in frames:
                conn.data_received(f)
            out[f"cpu_us_per_pull_{back}_units"] = round((time.process_time() - c0) / pulls * 1e6, 2)
            out[f"codes_{back}_units"] = sorted({f.code for f in t.take()})
    finally:
        await broker.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 pulls per window instead of 5,000")
    args = ap.parse_args()
    pulls = 1000 if args.quick else 5000
    with tempfile.TemporaryDirectory(prefix="sluice-pull-few-") as tmp:
        res = asyncio.run(_run(tmp, pulls))
    res = {"quick": args.quick, "pulls_per_window": pulls, **res}
    for k, v in res.items():
        print(f"{k}: {v}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
