"""Committed consumer offsets per (group, topic, queue), persisted in {store}/config/consumerOffset.json.

Writes are cheap dict updates; a background call to ``persist()`` (every few
seconds and at shutdown) writes the table atomically, as RocketMQ's
ConsumerOffsetManager does.

Beside RocketMQ's ``offsetTable`` the file keeps ``subscribedAt`` (Sluice's):
when each push consumer group first subscribed each topic (epoch ms), so a
new group's start offset can be "where it subscribed" (broker/queries.py).
"""
from __future__ import annotations

import threading
from pathlib import Path

from sluice.persist import json_bytes, read_json, write_json_bytes_atomic

SEP = "@"  # RocketMQ keys the table "topic@group"


class ConsumerOffsetManager:
    def __init__(self, config_dir: Path) -> None:
        self._path = config_dir / "consumerOffset.json"
        self._lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}
        self._subscribed: dict[str, int] = {}  # "topic@group" -> when the group first subscribed, epoch ms
        self._dirty = False
        data = read_json(self._path, default={}) or {}
        for key, queues in data.get("offsetTable", {}).items():
            self._table[key] = {int(q): int(o) for q, o in queues.items()}
        self._subscribed = {k: int(v) for k, v in (data.get("subscribedAt") or {}).items()}

    @staticmethod
    def _key(topic: str, group: str) -> str:
        return f"{topic}{SEP}{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._table.setdefault(self._key(topic, group), {})[queue_id] = offset
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed one for this queue."""
        return self._table.get(self._key(topic, group), {}).get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(self._key(topic, group), {}))

    def groups_of_topic(self, topic: str) -> set[str]:
        prefix = topic + SEP
        return {k[len(prefix):] for k in list(self._table) if k.startswith(prefix)}

    def groups(self) -> set[str]:
        """Every group with a committed offset."""
        return {k.partition(SEP)[2] for k in list(self._table)}

    def topics_of_group(self, group: str) -> set[str]:
        suffix = SEP + group
        return {k[: -len(suffix)] for k in list(self._table) if k.endswith(suffix)}

    def note_subscribed(self, group: str, topic: str, when_ms: int) -> None:
        """Record when ``group`` first subscribed ``topic`` (kept from the first call on)."""
        key = self._key(topic, group)
        if key in self._subscribed:
            return
        with self._lock:
            self._subscribed.setdefault(key, when_ms)
            self._dirty = True

    def subscribed_at(self, group: str, topic: str) -> int | None:
        return self._subscribed.get(self._key(topic, group))

    def remove(self, group: str, topic: str) -> None:
        with self._lock:
            key = self._key(topic, group)
            had = (self._table.pop(key, None), self._subscribed.pop(key, None))
            if had != (None, None):
                self._dirty = True

    def remove_group(self, group: str) -> None:
        """Every committed offset of ``group`` (DELETE_SUBSCRIPTIONGROUP with removeOffset)."""
        suffix = SEP + group
        with self._lock:
            for key in [k for k in self._table if k.endswith(suffix)]:
                del self._table[key]
                self._dirty = True
            for key in [k for k in self._subscribed if k.endswith(suffix)]:
                del self._subscribed[key]
                self._dirty = True

    def clamp(self, topic: str, queue_id: int, min_offset: int) -> None:
        """After retention moved a queue's minimum, committed offsets below it move up too."""
        with self._lock:
            prefix = topic + SEP
            for key, queues in self._table.items():
                if key.startswith(prefix) and queues.get(queue_id, min_offset) < min_offset:
                    queues[queue_id] = min_offset
                    self._dirty = True

    def persist(self, force: bool = False) -> None:
        with self._lock:
            if not (self._dirty or force):
                return
            # Serialised from the live table under the lock (orjson writes the queue ids as strings): copying
            # it first took several times longer, and both hold the GIL the broker's event loop needs
            # (1,000 groups of 64 queues: 2.7 ms against 12.5).
            data = json_bytes({"offsetTable": self._table, "subscribedAt": self._subscribed})
            self._dirty = False
        write_json_bytes_atomic(self._path, data)
