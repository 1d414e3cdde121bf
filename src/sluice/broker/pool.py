"""The broker's threads for blocking store calls (fsync waits, cold reads, file writes), off the event loop."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["BlockingPool"]

T = TypeVar("T")


class BlockingPool:
    def __init__(self, threads: int, *, name: str = "sluice-broker-store") -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a pool thread and wait for it."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    def shutdown(self) -> None:
        """Wait for the calls under way, take no more (blocking)."""
        self.executor.shutdown(wait=True)
