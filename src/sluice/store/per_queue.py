"""A table of per-queue objects kept under ``{root}/{topic}/{queueId}``: the consume queues and their ext files.

Readers look objects up without a lock: creation replaces the dict (copy on write) under a lock
that only writers take.
"""
from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from itertools import islice
from pathlib import Path
from typing import Generic, Protocol, TypeVar

__all__ = ["PerQueueFiles", "PerQueueTable", "Evictable", "OpenFilesLru"]

log = logging.getLogger(__name__)


class Evictable(Protocol):
    """A per-queue object whose files the LRU may close; it reopens them itself on its next use."""

    #: held while the object's files are used; the LRU only evicts an object whose lock it gets at once
    lock: threading.RLock

    def evict_files(self) -> None:
        """Make the files durable as far as written, then close them (called with ``lock`` held)."""


class OpenFilesLru:
    """Per-queue objects with open files, least recently used first; past ``capacity`` the oldest are
    closed (``evict_files``). Objects call :meth:`touch` (holding their own lock) each time they use their
    files. The LRU's own lock is never held while taking an object's lock, and an object's lock is only
    tried (never waited for), so no two threads can wait for each other."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.evictions = 0
        self._open: OrderedDict[Evictable, None] = OrderedDict()
        self._lock = threading.Lock()
        self._last: Evictable | None = None  # the object touched last (read without the lock: a hint)

    def __len__(self) -> int:
        return len(self._open)

    def touch(self, obj: Evictable) -> None:
        if self._last is obj:  # the same queue again (a pull's windows, a dispatch batch): nothing moves
            return
        self._last = obj
        with self._lock:
            od = self._open
            if obj in od:
                od.move_to_end(obj)
                return
            od[obj] = None
            excess = len(od) - self.capacity
            if excess <= 0:
                return
            victims = list(islice((o for o in od if o is not obj), excess + 8))  # oldest first; some may be busy
        for v in victims:
            if excess <= 0:
                break
            if not v.lock.acquire(blocking=False):
                continue  # in use right now: not cold
            try:
                with self._lock:
                    if v not in self._open:
                        continue
                    del self._open[v]
                    if self._last is v:  # v's lock is held: no one is touching it now
                        self._last = None
                try:
                    v.evict_files()
                except Exception:  # the object stays usable: it reopens its files on its next use
                    log.exception("closing the files of %r failed", v)
                self.evictions += 1
                excess -= 1
            finally:
                v.lock.release()

    def forget(self, obj: Evictable) -> None:
        """``obj`` closed its files by itself (store close, deletion)."""
        with self._lock:
            self._open.pop(obj, None)
            if self._last is obj:
                self._last = None


class PerQueueFiles(Protocol):
    """What the table needs of what it holds."""

    def load(self) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


T = TypeVar("T", bound=PerQueueFiles)


class PerQueueTable(ABC, Generic[T]):
    """Objects of one kind, one per (topic, queue id), loaded from disk or created on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.by_queue: dict[tuple[str, int], T] = {}
        self._lock = threading.Lock()

    @abstractmethod
    def _new(self, topic: str, queue_id: int, directory: Path) -> T:
        """The object of one queue, whose files live in ``directory``."""

    def load(self) -> None:
        if not self.root.is_dir():
            return
        for tdir in sorted(self.root.iterdir()):
            if not tdir.is_dir():
                continue
            for qdir in sorted(tdir.iterdir()):
                if qdir.is_dir() and qdir.name.isdigit():
                    obj = self._new(tdir.name, int(qdir.name), qdir)
                    obj.load()
                    self.by_queue[(tdir.name, int(qdir.name))] = obj

    def get(self, topic: str, queue_id: int) -> T | None:
        return self.by_queue.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> T:
        obj = self.by_queue.get((topic, queue_id))
        if obj is None:
            with self._lock:
                obj = self.by_queue.get((topic, queue_id))
                if obj is None:
                    obj = self._new(topic, queue_id, self.root / topic / str(queue_id))
                    self.by_queue = {**self.by_queue, (topic, queue_id): obj}
        return obj

    def all(self) -> list[T]:
        return list(self.by_queue.values())

    def flush(self) -> None:
        for obj in self.all():
            obj.flush()

    def close(self) -> None:
        for obj in self.all():
            obj.close()
