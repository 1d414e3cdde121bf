"""A table of per-queue objects kept under ``{root}/{topic}/{queueId}``: the consume queues and their ext files.

Readers look objects up without a lock: creation replaces the dict (copy on write) under a lock
that only writers take.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Generic, Protocol, TypeVar

__all__ = ["PerQueueFiles", "PerQueueTable"]


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
