"""The filter server's classes, keyed by topic@group (RocketMQ's FilterClassManager,
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/filter/FilterClassManager.java).

A registration (REGISTER_MESSAGE_FILTER_CLASS, 302) names a class and carries
its source when the consumer uploads one. The source comes from the upload
(only with uploads on) or else from the repository; its CRC32 decides:

* the same class and CRC as registered: nothing is loaded again, concurrent
  registrations wait for the one load (and share its answer, error included);
* a new CRC for the class: the class is replaced (loaded in a new worker, the
  old worker ended);
* a different class while another live member of the group (another connection
  that registered the class and is still open) holds the registered one: a
  conflict error, as SQL92 subscriptions of one group that differ get;
  with no other live holder, the new class replaces the old.

A load that fails is kept with its error, so a pull answers that error (and a
registration of the same source does not load it again). The repository's
files are re-checked every ``check_interval`` seconds; a changed CRC reloads the
class. Entries no live connection holds and no pull used for ``idle_drop_s``
are dropped with their workers.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import (
    FilterClassConflictError, FilterClassError, FilterClassFailedError, FilterClassImportError,
    FilterClassUploadRefusedError, SluiceError,
)
from sluice.filter.classfilter import parse_class_name
from sluice.filtersrv.repository import MAX_SOURCE_BYTES, ClassRepository, class_crc, crc_matches
from sluice.filtersrv.sandbox import Worker, WorkerLimits
from sluice.filtersrv.spans import offsets_of
from sluice.protocol.codes import ResponseCode

__all__ = ["ClassEntry", "FilterClassRegistry", "FilterOutcome"]

log = logging.getLogger(__name__)

#: An entry with no live holder, unused by pulls this long, is dropped (its worker ended).
IDLE_DROP_S = 300.0
#: A class that failed to load is loaded again by a registration at most this often (a load that failed
#: for a passing reason, a deadline on a busy host, is not kept forever; a broken class is not reloaded
#: at every heartbeat of every member).
RETRY_FAILED_LOAD_S = 10.0
#: After a class fails on a batch its next batch waits this long (doubling per failure in a row up to the
#: second figure; pulls meanwhile get the last error at once), so a class that spins or hangs on every
#: batch costs its limits once per pause, not once per pull of every member.
FAILURE_BACKOFF_S = (1.0, 60.0)


@dataclass(slots=True)
class ClassEntry:
    topic: str
    group: str
    class_name: str
    crc: int
    source: bytes
    uploaded: bool
    limits: WorkerLimits
    #: The members that registered this class: owner -> is it still live (a callable).
    holders: dict[Hashable, Any] = field(default_factory=dict)
    worker: Worker | None = None
    error: FilterClassError | None = None
    ready: asyncio.Future[None] | None = None
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    batches: int = 0
    failures: int = 0
    failed_at: float = 0.0
    failures_in_row: int = 0
    last_failure: FilterClassError | None = None
    paused_until: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.topic}@{self.group}"

    def live_holders(self) -> list[Hashable]:
        return [o for o, alive in self.holders.items() if alive()]

    async def load(self) -> None:
        """Start a worker with the class; the error is kept (and raised) if it does not load."""
        worker = Worker(self.class_name, self.source, self.limits)
        try:
            await worker.start()
        except FilterClassError as exc:
            self.error, self.failed_at = exc, time.monotonic()
            log.warning("filter class %s for %s: %s", self.class_name, self.key, exc.cause)
            raise
        self.worker, self.error = worker, None

    async def close(self) -> None:
        if self.ready is not None and not self.ready.done():
            self.ready.cancel()
        if self.worker is not None:
            await self.worker.kill()


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    kept: list[memoryview]  # the kept records, in queue order
    total: int


class FilterClassRegistry:
    def __init__(self, repository: ClassRepository, limits: WorkerLimits, *, uploads: bool = False,
                 check_interval: float = 60.0, idle_drop_s: float = IDLE_DROP_S) -> None:
        self.repository = repository
        self.limits = limits
        self.uploads = uploads
        self.check_interval = check_interval
        self.idle_drop_s = idle_drop_s
        self.entries: dict[tuple[str, str], ClassEntry] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------------------ registration

    async def register(self, group: str, topic: str, class_name: str, crc: int, body: bytes,
                       owner: Hashable, alive: Any = lambda: True, *, may_upload: bool = True) -> ClassEntry:
        """Register (topic, group)'s class; returns its entry once loaded, or raises the FilterClassError
        that says why not. ``owner`` names the registering member, ``alive()`` says if it still is."""
        try:
            parse_class_name(class_name)
        except ValueError as exc:
            raise FilterClassImportError(str(exc), class_name=class_name, cause=str(exc)) from None
        if body:
            if not self.uploads:
                raise FilterClassUploadRefusedError(
                    f"filter class {class_name!r}: uploads are refused by this filter server "
                    "(filter_class_uploads = false); the operator puts the class in its repository "
                    "(filter_class_repository) and the consumer registers it without source",
                    class_name=class_name, cause="uploads refused")
            if not may_upload:
                raise FilterClassUploadRefusedError(
                    f"filter class {class_name!r}: this account may not upload filter classes (ACL)",
                    class_name=class_name, cause="account may not upload")
            if len(body) > MAX_SOURCE_BYTES:
                raise FilterClassImportError(f"filter class {class_name!r}: the source is {len(body)} bytes, more "
                                             f"than {MAX_SOURCE_BYTES}", class_name=class_name,
                                             cause="source too large")
            if crc and not crc_matches(crc, body):
                raise FilterClassImportError(
                    f"filter class {class_name!r}: classCRC {crc} is not the CRC32 of the source sent "
                    f"({class_crc(body)}, or {class_crc(body) & 0x7FFFFFFF} masked to 31 bits)",
                    class_name=class_name, cause="classCRC mismatch")
            source, uploaded = bytes(body), True
        else:
            source, uploaded = await self.repository.load(class_name), False
        key = (topic, group)
        new_crc = class_crc(source)
        entry = self.entries.get(key)
        if entry is not None and entry.class_name != class_name:
            others = [o for o in entry.live_holders() if o != owner]
            if others:
                raise FilterClassConflictError(
                    f"filter class conflict in group {group!r} on topic {topic!r}: {len(others)} live member(s) "
                    f"registered {entry.class_name!r}, this member registers {class_name!r}; every member of a "
                    "group must filter a topic with the same class", class_name=class_name,
                    cause=f"group holds {entry.class_name!r}")
        retry = entry is not None and entry.error is not None and entry.worker is None and entry.ready is not None \
            and entry.ready.done() and time.monotonic() - entry.failed_at > RETRY_FAILED_LOAD_S
        if entry is None or entry.class_name != class_name or entry.crc != new_crc or retry:
            old = entry
            entry = ClassEntry(topic, group, class_name, new_crc, source, uploaded, self.limits,
                               holders=dict(old.holders) if old is not None and old.class_name == class_name else {})
            entry.ready = asyncio.get_running_loop().create_task(entry.load())
            self.entries[key] = entry
            if old is not None:
                log.info("filter class for %s@%s replaced: %s (CRC %d) -> %s (CRC %d)", topic, group,
                         old.class_name, old.crc, class_name, new_crc)
                closing = asyncio.get_running_loop().create_task(old.close())
                self._closing.add(closing)  # held until done: the loop keeps only weak references to tasks
                closing.add_done_callback(self._closing.discard)
        entry.holders[owner] = alive
        assert entry.ready is not None
        await asyncio.shield(entry.ready)  # the one load; its error is every waiter's error
        return entry

    def forget_owner(self, owner: Hashable) -> None:
        for entry in self.entries.values():
            entry.holders.pop(owner, None)

    # ------------------------------------------------------------------------------------------ filtering

    def entry(self, topic: str, group: str) -> ClassEntry:
        entry = self.entries.get((topic, group))
        if entry is None:
            raise SluiceError(f"no filter class registered for topic {topic!r} and group {group!r} on this filter "
                              "server: register it first (REGISTER_MESSAGE_FILTER_CLASS, 302)",
                              code=ResponseCode.SUBSCRIPTION_NOT_EXIST)
        return entry

    async def filter(self, entry: ClassEntry, body: bytes) -> FilterOutcome:
        """Run the entry's class on one pulled batch. A worker that failed is replaced first; any failure
        raises FilterClassError (the worker killed), and nothing is kept."""
        entry.last_used = time.monotonic()
        offsets = offsets_of(body)  # boundaries only: no per-record object until a record is kept
        count = len(offsets) - 1
        async with entry.lock:
            if entry.ready is not None and not entry.ready.done():
                await asyncio.shield(entry.ready)
            if entry.worker is None and entry.error is not None:
                raise entry.error  # the class did not load: until it is registered again or reloaded
            wait = entry.paused_until - time.monotonic()
            if wait > 0 and entry.last_failure is not None:  # a failing class does not get a worker per pull
                last = entry.last_failure
                raise FilterClassFailedError(
                    f"{last} (failed {entry.failures_in_row} time(s) in a row; its next batch runs in {wait:.1f} s)",
                    class_name=entry.class_name, cause=last.cause)
            if entry.worker is None or not entry.worker.alive or entry.worker.worn:
                if entry.worker is not None:
                    await entry.worker.kill()
                    entry.worker = None
                await entry.load()  # a load error is kept and raised
            assert entry.worker is not None
            try:
                mask = await entry.worker.filter(body, count)
            except FilterClassError as exc:
                entry.failures += 1
                entry.failures_in_row += 1
                entry.last_failure = exc
                pause = min(FAILURE_BACKOFF_S[1], FAILURE_BACKOFF_S[0] * 2 ** (entry.failures_in_row - 1))
                entry.paused_until = time.monotonic() + pause
                log.warning("filter class %s for %s: %s (worker killed; a new one runs its next batch in %g s)",
                            entry.class_name, entry.key, exc.cause, pause)
                raise
            entry.batches += 1
            entry.failures_in_row = 0
        view, kept = memoryview(body), []
        at = mask.find(1)
        while at >= 0:  # per kept record only (the mask holds 0 and 1 alone: Worker.filter checked it)
            kept.append(view[offsets[at]:offsets[at + 1]])
            at = mask.find(1, at + 1)
        return FilterOutcome(kept, count)

    # ------------------------------------------------------------------------------------------ upkeep

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._upkeep(), name="filter-class-upkeep")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        entries, self.entries = list(self.entries.values()), {}
        await asyncio.gather(*(e.close() for e in entries), return_exceptions=True)

    async def _upkeep(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval)
            try:
                await self.recheck()
            except Exception:  # the loop must survive whatever one round meets
                log.exception("filter class re-check failed")

    async def recheck(self) -> None:
        """Reload repository classes whose file's CRC changed; drop idle entries no live member holds."""
        now = time.monotonic()
        for key, entry in list(self.entries.items()):
            if not entry.live_holders() and now - entry.last_used > self.idle_drop_s:
                del self.entries[key]
                await entry.close()
                continue
            if entry.uploaded:
                continue
            try:
                source = await self.repository.load(entry.class_name)
            except FilterClassError as exc:
                log.warning("filter class %s for %s: %s (the loaded class keeps serving)", entry.class_name,
                            entry.key, exc.cause)
                continue
            if class_crc(source) == entry.crc or self.entries.get(key) is not entry:
                continue
            fresh = ClassEntry(entry.topic, entry.group, entry.class_name, class_crc(source), source, False,
                               self.limits, holders=entry.holders)
            fresh.ready = asyncio.get_running_loop().create_task(fresh.load())
            self.entries[key] = fresh
            log.info("filter class %s for %s reloaded from the repository (CRC %d -> %d)", entry.class_name,
                     entry.key, entry.crc, fresh.crc)
            await asyncio.gather(fresh.ready, return_exceptions=True)
            await entry.close()
