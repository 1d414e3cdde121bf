"""Consumer offset stores: on the broker for CLUSTERING, in a local file for BROADCASTING.

Both keep the group's next offset per queue in memory (``update`` is a dict
write on the consumer's loop) and write it out with ``persist_all`` — every
``persist_offset_interval`` (5 s) through the client instance, when a queue is
released by a rebalance, and at shutdown (RemoteBrokerOffsetStore /
LocalFileOffsetStore). ``read`` answers -1 when there is no offset, and the
consumer then applies its consume_from_where; errors other than "not found"
are raised so a queue is never started from a guessed position.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Protocol

from sluice.client.results import MessageQueue, queue_sort_key
from sluice.errors import SluiceError
from sluice.persist import read_json, write_json_atomic

__all__ = ["LocalFileOffsetStore", "OffsetStore", "RemoteBrokerOffsetStore"]

log = logging.getLogger(__name__)


class OffsetStore(Protocol):
    async def load(self) -> None: ...

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None: ...

    def read_memory(self, mq: MessageQueue) -> int: ...

    async def read_store(self, mq: MessageQueue) -> int: ...

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, mq: MessageQueue) -> None: ...

    def remove(self, mq: MessageQueue) -> None: ...


class _MemoryTable:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}
        self.dirty: set[MessageQueue] = set()

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        if offset < 0:
            return
        old = self.table.get(mq)
        if old is not None and increase_only and offset <= old:
            return
        if old != offset:
            self.table[mq] = offset
            self.dirty.add(mq)

    def read_memory(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)
        self.dirty.discard(mq)


#: ``fn(mq) -> offset or -1`` and ``fn(mq, offset)``: the broker calls, bound to a group and its brokers.
QueryFn = Callable[[MessageQueue], Awaitable[int]]
CommitFn = Callable[[MessageQueue, int], Awaitable[None]]


class RemoteBrokerOffsetStore(_MemoryTable):
    """CLUSTERING: QUERY_CONSUMER_OFFSET when a queue is taken, UPDATE_CONSUMER_OFFSET to persist."""

    def __init__(self, query: QueryFn, commit: CommitFn) -> None:
        super().__init__()
        self._query = query
        self._commit = commit

    async def load(self) -> None:
        return None

    async def read_store(self, mq: MessageQueue) -> int:
        offset = await self._query(mq)
        if offset >= 0:
            self.table[mq] = offset
            self.dirty.discard(mq)
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = [mq for mq in sorted(set(mqs), key=queue_sort_key) if mq in self.dirty]
        await asyncio.gather(*(self.persist(mq) for mq in wanted))

    async def persist(self, mq: MessageQueue) -> None:
        offset = self.table.get(mq)
        if offset is None:
            return
        self.dirty.discard(mq)
        try:
            await self._commit(mq, offset)
        except SluiceError as exc:
            if self.table.get(mq) == offset:
                self.dirty.add(mq)
            log.warning("committing offset %d of %s failed: %s", offset, mq, exc)


class LocalFileOffsetStore(_MemoryTable):
    """BROADCASTING: one JSON file per group, replaced atomically (temp file, fsync, rename)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._stored: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        doc = await asyncio.to_thread(read_json, self.path, {})
        for e in (doc or {}).get("offsetTable", []):
            try:
                mq = MessageQueue(topic=str(e["topic"]), broker_name=str(e["brokerName"]),
                                  queue_id=int(e["queueId"]))
                self._stored[mq] = int(e["offset"])
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring a bad entry in %s: %r", self.path, e)
        self.table.update(self._stored)

    async def read_store(self, mq: MessageQueue) -> int:
        offset = self._stored.get(mq, -1)
        if offset >= 0:
            self.table[mq] = offset
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        if not self.dirty:
            return
        # Queues not in ``mqs`` keep their last stored offset: a broadcast member owns every queue,
        # and a queue briefly missing from a route must not lose its progress.
        self._stored.update(self.table)
        self.dirty.clear()
        entries = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                   for mq, off in sorted(self._stored.items(), key=lambda kv: queue_sort_key(kv[0]))]
        try:
            await asyncio.to_thread(write_json_atomic, self.path, {"offsetTable": entries})
        except OSError as exc:
            log.warning("writing broadcast offsets to %s failed: %s", self.path, exc)

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all([mq])
