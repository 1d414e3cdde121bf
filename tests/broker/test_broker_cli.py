"""``sluice broker``'s run_broker: what starting built is frozen out of the garbage collector's generations."""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from pathlib import Path

from sluice.broker.cli import run_broker
from sluice.broker.config import BrokerConfig
from sluice.embedded import free_port, port_accepts


def test_the_started_broker_freezes_its_startup_heap(tmp_path: Path) -> None:
    port = free_port()
    config = BrokerConfig.load(None, listen=f"127.0.0.1:{port}", store=str(tmp_path / "store"))
    switch = sys.getswitchinterval()
    gc.unfreeze()
    frozen: list[int] = []

    async def main() -> None:
        task = asyncio.create_task(run_broker(config))
        for _ in range(600):
            if task.done() or await asyncio.to_thread(port_accepts, "127.0.0.1", port):
                break
            await asyncio.sleep(0.05)
        for _ in range(100):  # the port opens inside start(); the freeze follows it
            if gc.get_freeze_count() or task.done():
                break
            await asyncio.sleep(0.01)
        frozen.append(gc.get_freeze_count())
        os.kill(os.getpid(), signal.SIGTERM)  # run_broker's handler: a graceful stop
        await task
    try:
        assert gc.get_freeze_count() == 0
        asyncio.run(main())
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch)
    assert frozen[0] > 0
