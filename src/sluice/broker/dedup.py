"""Broker-side duplicate check for replayed writes (the Spark writer's micro-batches), within a window.

Opt-in per send request: the producer group starts with one of ``dedup_producer_group_prefixes``
(default ``spark-sluice-writer-``, the groups the Spark writer sends with). Ordinary sends pay one
``str.startswith`` per request and are never deduplicated (RocketMQ semantics: two sends with the same
UNIQ_KEY are two messages).

For an opted-in send, each message's UNIQ_KEY is looked up in the topic's window of recently stored
keys. A hit is answered with the ORIGINAL result (offset msg id, queue, queue offset) and not stored
again; misses are stored and recorded once the store accepted them. Two concurrent sends of the same key
cannot both be stored: a key being stored is "in flight" (all on the event loop, so no lock), and a
second send of it waits for the first and then answers from the window (or stores it itself if the first
failed, as a client retry would).

The window is bounded by age (``dedup_window_seconds``, by store time) and size (``dedup_window_keys``
per broker, oldest evicted first). Stored messages that were checked carry the property
``SLUICE_DEDUP=1``, so after a restart the window is rebuilt by walking the commit log's tail (the
segments holding the last window of store times) and keeping the marked records; opted-in sends wait
for that walk, ordinary sends do not.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from sluice.protocol import properties as P
from sluice.ratelog import RateLimitedLog
from sluice.protocol.msgid import create_offset_msg_id
from sluice.format import ParsedRecord
from sluice.store.commitlog import CommitLog
from sluice.store import MessageStore, PutResult, StoreMessage

__all__ = ["DedupWindow", "Original", "DEDUP_PROPERTY"]

log = logging.getLogger(__name__)
#: Replays come in floods (a Spark batch retried sends every row again): one INFO line a minute says so, with
#: how many more were left out; each one is at DEBUG.
_replay_log = RateLimitedLog(log, 60.0)

#: Marks a stored message whose UNIQ_KEY went through the check (found again by the restart rebuild).
DEDUP_PROPERTY = "SLUICE_DEDUP"
_REAL_TOPIC = "REAL_TOPIC"  # a delayed message's own topic (it is stored in the schedule topic first)


class Original(NamedTuple):
    """What the first send of a key was answered with."""

    queue_id: int
    result: PutResult


Store = Callable[[list[StoreMessage]], Awaitable[list[PutResult]]]


class DedupWindow:
    def __init__(self, *, max_keys: int, window_ms: int, prefixes: tuple[str, ...]) -> None:
        self.max_keys = max_keys
        self.window_ms = window_ms
        self.prefixes = tuple(p for p in prefixes if p)
        self._by_topic: dict[str, dict[str, Original]] = {}
        self._fifo: deque[tuple[int, str, str]] = deque()  # (store time, topic, key), oldest first
        self._in_flight: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._ready = asyncio.Event()
        self.duplicates = 0
        self.evicted = 0
        self.rebuilt = 0

    def applies(self, producer_group: str | None) -> bool:
        """The one check an ordinary send pays."""
        return bool(self.prefixes) and bool(producer_group) and producer_group.startswith(self.prefixes)

    def __len__(self) -> int:
        return len(self._fifo)

    def lookup(self, topic: str, key: str) -> Original | None:
        win = self._by_topic.get(topic)
        return None if win is None else win.get(key)

    # ---- the send path -----------------------------------------------------------------------------
    async def put(self, topic: str, msgs: list[StoreMessage], store: Store) -> list[Original]:
        """Store the messages of ``msgs`` whose UNIQ_KEY is not in ``topic``'s window; one Original per
        message, in order (the first send's for duplicates). Messages without a UNIQ_KEY are stored."""
        await self._ready.wait()
        keys = [m.properties.get(P.UNIQ_KEY) or None for m in msgs]
        queue_ids = [m.queue_id for m in msgs]  # as asked: a delayed message is diverted to a schedule queue
        while True:
            self._evict(int(time.time() * 1000))
            out: list[Original | None] = [None] * len(msgs)
            todo: list[int] = []
            first_in_request: dict[str, int] = {}
            waits: list[asyncio.Future[None]] = []
            win = self._by_topic.get(topic) or {}
            for i, k in enumerate(keys):
                if k is None:
                    todo.append(i)
                    continue
                hit = win.get(k)
                if hit is not None:
                    out[i] = hit
                elif (f := self._in_flight.get((topic, k))) is not None:
                    waits.append(f)
                elif k not in first_in_request:
                    first_in_request[k] = i
                    todo.append(i)
            if not waits:
                break
            # Another send of some key is being stored: wait for it, then look again.
            await asyncio.gather(*(asyncio.shield(f) for f in waits), return_exceptions=True)
        mine = {k: asyncio.get_running_loop().create_future() for k in first_in_request}
        for k, f in mine.items():
            self._in_flight[(topic, k)] = f
        try:
            batch = [msgs[i] for i in todo]
            for m in batch:
                m.properties[DEDUP_PROPERTY] = "1"
            stored = await store(batch) if batch else []
            for i, r in zip(todo, stored):
                o = Original(queue_ids[i], r)
                out[i] = o
                if keys[i] is not None:
                    self._record(topic, keys[i], o)  # type: ignore[arg-type]
        finally:
            for k, f in mine.items():
                self._in_flight.pop((topic, k), None)
                f.set_result(None)
        dups = len(msgs) - len(todo)
        for i, k in enumerate(keys):  # a key repeated inside one request answers as its first copy
            if out[i] is None and k is not None:
                out[i] = out[first_in_request[k]]
        self.duplicates += dups
        if dups:
            log.debug("send to %s: %d of %d messages were already stored (replay), answered with the originals",
                      topic, dups, len(msgs))
            _replay_log.log(logging.INFO, "send to %s: %d of %d messages were already stored (replay), answered "
                            "with the originals (%d duplicates in all)", topic, dups, len(msgs),
                            self.duplicates)
        return out  # type: ignore[return-value]

    def _record(self, topic: str, key: str, o: Original) -> None:
        win = self._by_topic.setdefault(topic, {})
        if key in win:
            return
        win[key] = o
        self._fifo.append((o.result.store_timestamp, topic, key))
        if len(self._fifo) > self.max_keys:
            self._evict(0)

    def _evict(self, now_ms: int) -> None:
        cutoff = now_ms - self.window_ms if now_ms else None
        fifo = self._fifo
        while fifo and (len(fifo) > self.max_keys or (cutoff is not None and fifo[0][0] < cutoff)):
            _, topic, key = fifo.popleft()
            win = self._by_topic.get(topic)
            if win is not None:
                win.pop(key, None)
                if not win:
                    del self._by_topic[topic]
            self.evicted += 1

    # ---- restart -----------------------------------------------------------------------------------
    def rebuild(self, store: MessageStore, store_host: tuple[str, int]) -> None:
        """Refill the window from the marked records of the commit log's last ``window_ms`` (blocking;
        run on a worker thread before :meth:`open`)."""
        cutoff = int(time.time() * 1000) - self.window_ms
        cl = store.commitlog
        start = None
        for f in cl.segments():  # the last segment whose first record is older than the cutoff
            ts = cl.store_timestamp_at(f.start)
            if ts is None:
                break
            if ts < cutoff or start is None:
                start = f.start
        if start is None:
            return
        host, port = store_host
        found: list[tuple[str, str, Original]] = []

        def on_record(rec: ParsedRecord) -> None:
            if rec.store_timestamp < cutoff:
                return
            raw = rec.properties
            if DEDUP_PROPERTY not in raw:  # a text test first: most records are not marked
                return
            props = P.decode_properties(raw)
            key = props.get(P.UNIQ_KEY)
            if props.get(DEDUP_PROPERTY) != "1" or not key:
                return
            r = PutResult(rec.physical_offset, rec.queue_offset,
                          create_offset_msg_id(host, port, rec.physical_offset), rec.store_timestamp, rec.total_size)
            found.append((props.get(_REAL_TOPIC) or rec.topic, key, Original(rec.queue_id, r)))

        _walk(cl, start, on_record)
        for topic, key, o in found:
            self._record(topic, key, o)
        self.rebuilt = len(found)

    def open(self) -> None:
        """Opted-in sends may proceed (call on the event loop after :meth:`rebuild`)."""
        self._ready.set()

    def stats(self) -> dict[str, int]:
        return {"dedupWindowKeys": len(self._fifo), "dedupDuplicates": self.duplicates,
                "dedupEvicted": self.evicted, "dedupRebuilt": self.rebuilt}


def _walk(cl: CommitLog, start: int, on_record: Callable[[ParsedRecord], None]) -> None:
    """Records from ``start`` (a segment start) to the end of the written data, read through the mapping in
    bounded windows whose pages are released after (CommitLog.scan): memory does not grow with the tail."""
    end, err = cl.scan(start, check_crc=False, on_record=on_record)
    if err is not None:
        log.warning("dedup rebuild stopped at commit-log offset %d: %s", end, err)
