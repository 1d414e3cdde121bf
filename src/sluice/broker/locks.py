"""Queue locks for orderly consumers (RebalanceLockManager): one owner per (group, queue), expiring.

An orderly consumer locks the queues it was allocated (LOCK_BATCH_MQ) and
renews the locks every 20 s; a lock not renewed for 60 s expires, so a dead
consumer's queues can be taken by another member.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

QueueKey = tuple[str, str, int]  # (topic, broker name, queue id): RocketMQ's MessageQueue


@dataclass(slots=True)
class _Lock:
    client_id: str
    last_update: float


class RebalanceLockManager:
    def __init__(self, max_live_ms: int = 60_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_live = max_live_ms / 1000.0
        self._clock = clock
        self._mutex = threading.Lock()
        self._table: dict[str, dict[QueueKey, _Lock]] = {}

    def _expired(self, lock: _Lock, now: float) -> bool:
        return now - lock.last_update > self._max_live

    def try_lock_batch(self, group: str, queues: Iterable[QueueKey], client_id: str) -> set[QueueKey]:
        """Lock (or renew) what is free or already ours; return the queues this client now holds."""
        now = self._clock()
        got: set[QueueKey] = set()
        with self._mutex:
            locks = self._table.setdefault(group, {})
            for mq in queues:
                cur = locks.get(mq)
                if cur is None or cur.client_id == client_id or self._expired(cur, now):
                    locks[mq] = _Lock(client_id, now)
                    got.add(mq)
        return got

    def unlock_batch(self, group: str, queues: Iterable[QueueKey], client_id: str) -> None:
        with self._mutex:
            locks = self._table.get(group, {})
            for mq in queues:
                cur = locks.get(mq)
                if cur is not None and cur.client_id == client_id:
                    del locks[mq]

    def is_locked_by(self, group: str, mq: QueueKey, client_id: str) -> bool:
        with self._mutex:
            cur = self._table.get(group, {}).get(mq)
            return cur is not None and cur.client_id == client_id and not self._expired(cur, self._clock())

    def owner(self, group: str, mq: QueueKey) -> str | None:
        with self._mutex:
            cur = self._table.get(group, {}).get(mq)
            if cur is None or self._expired(cur, self._clock()):
                return None
            return cur.client_id

    def release_client(self, client_id: str) -> None:
        """A client's connection went away: its locks go with it, so others need not wait 60 s."""
        with self._mutex:
            for locks in self._table.values():
                for mq in [mq for mq, lk in locks.items() if lk.client_id == client_id]:
                    del locks[mq]
