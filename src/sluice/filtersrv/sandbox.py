"""The filter server's side of a worker subprocess (sluice/filtersrv/worker.py): start, filter a batch, kill.

One :class:`Worker` runs one filter class. ``start`` sends the class and waits
until it loaded (or raises FilterClassImportError with the worker's cause);
``filter`` hands it one pulled batch and returns which records to keep, within
the per-batch deadline. Any failure — the class raised, the deadline passed, the
CPU or memory limit ended the worker, it died or answered garbage — kills the
worker and raises FilterClassFailedError naming the class and the cause; the
registry then starts a fresh worker for the next batch.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import mmap
import os
import signal
import struct
import sys
from dataclasses import dataclass

from sluice.errors import FilterClassFailedError, FilterClassImportError
from sluice.filtersrv import worker as W
from sluice.filtersrv.spans import offsets_of

__all__ = ["WorkerLimits", "Worker", "split_records", "worker_env"]

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
_CPU = struct.Struct(">d")
#: The pipe size asked for (Linux's default pipe-max-size).
PIPE_BYTES = 1024 * 1024
#: Size of the memory file a worker's batches go through (a larger batch goes down the pipe): a write to a
#: pipe copies into fresh kernel pages and wakes the reader per chunk; a shared file costs one memcpy.
BATCH_BYTES = 4 * 1024 * 1024
#: Longest reply a worker may send (one byte per record of a batch, or an error text).
MAX_REPLY = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """What one worker may use. ``cpu_seconds``: CPU per batch (and for loading the class);
    ``memory_bytes``: address space (0: unlimited); ``deadline_s``: wall time per batch or load;
    ``cpu_lifetime_seconds``: CPU over the worker's life (it is replaced at half of it)."""

    cpu_seconds: float = 5.0
    memory_bytes: int = 512 * 1024 * 1024
    deadline_s: float = 5.0
    cpu_lifetime_seconds: float = 3600.0


def split_records(body: bytes) -> list[memoryview]:
    """The stored records a pull body holds back to back (each starts with its 4-byte total size);
    ValueError naming the first size that does not fit."""
    view, offsets = memoryview(body), offsets_of(body)
    return [view[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


#: Environment variables a worker never sees: the filter server's ACL account (a class could read and
#: use it) and anything else named like a secret.
_HIDDEN = ("SLUICE_FILTERSRV_", "AWS_", "AZURE_", "GOOGLE_")
_SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "ACCESS_KEY", "PRIVATE")


def worker_env() -> dict[str, str]:
    """The filter server's environment without credentials (a worker runs code the operator may not trust)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_HIDDEN) and not any(w in k.upper() for w in _SECRET_WORDS)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _widen_pipe(stream: asyncio.StreamWriter | None) -> None:
    """A batch (up to max_transfer_bytes, 256 KiB) goes down the pipe in one write rather than in 64 KiB
    turns of the event loop (Linux F_SETPIPE_SZ; left as it is where refused)."""
    pipe = stream.get_extra_info("pipe") if stream is not None else None
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or setpipe is None:
        return
    try:
        fcntl.fcntl(pipe.fileno(), setpipe, PIPE_BYTES)
    except OSError:
        pass


def _batch_file() -> int | None:
    """A memory file for batches (Linux memfd; None where there is none: batches then go down the pipe)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd = create("sluice-filter-batches", os.MFD_CLOEXEC)
        os.ftruncate(fd, BATCH_BYTES)
    except OSError as exc:
        log.warning("no shared memory file for filter batches (%s): they go down the pipe", exc)
        return None
    return fd


class Worker:
    def __init__(self, class_name: str, source: bytes, limits: WorkerLimits) -> None:
        self.class_name = class_name
        self.source = source
        self.limits = limits
        self.proc: asyncio.subprocess.Process | None = None
        self.cpu_used = 0.0
        self._lock = asyncio.Lock()
        self._shared: mmap.mmap | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def worn(self) -> bool:
        """Near its CPU lifetime: replace it before the kernel's hard limit would end it mid-batch."""
        return self.cpu_used > self.limits.cpu_lifetime_seconds / 2

    async def start(self) -> None:
        """Spawn the worker and load the class; FilterClassImportError if it cannot (worker killed)."""
        lim = self.limits
        conf = {"class_name": self.class_name, "cpu_seconds": lim.cpu_seconds,
                "cpu_lifetime_seconds": lim.cpu_lifetime_seconds, "memory_bytes": lim.memory_bytes}
        fd = _batch_file()
        try:
            if fd is not None:
                self._shared = mmap.mmap(fd, BATCH_BYTES)
                conf.update(batch_fd=fd, batch_bytes=BATCH_BYTES)
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sluice.filtersrv.worker", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=None, start_new_session=True,
                env=worker_env(), pass_fds=(fd,) if fd is not None else ())
        finally:
            if fd is not None:
                os.close(fd)  # the worker has its own; the mapping stays
        _widen_pipe(self.proc.stdin)
        try:
            kind, payload = await self._call([json.dumps(conf).encode(), self.source],
                                             max(lim.deadline_s, 10.0), "loading")
        except FilterClassFailedError as exc:
            raise FilterClassImportError(f"filter class {self.class_name!r} could not be loaded: {exc.cause}",
                                         class_name=self.class_name, cause=exc.cause) from None
        if kind == W.IMPORT_FAILED:
            cause = payload.decode("utf-8", "replace")
            await self.kill()
            raise FilterClassImportError(f"filter class {self.class_name!r} could not be loaded: {cause}",
                                         class_name=self.class_name, cause=cause)
        if kind != W.READY:
            await self.kill()
            raise FilterClassImportError(f"filter class {self.class_name!r}: its worker answered {kind!r} "
                                         "instead of ready", class_name=self.class_name, cause="bad worker reply")

    async def filter(self, body: bytes, count: int) -> bytes:
        """One byte per record of ``body`` (``count`` of them), 1 to keep; FilterClassFailedError on any
        failure, the worker then killed."""
        async with self._lock:
            if not self.alive:
                raise self._failed("its worker is not running")
            shared = self._shared
            if shared is not None and len(body) <= len(shared):
                shared[:len(body)] = body
                frames: list[bytes | list[bytes]] = [W.IN_SHARED + _LEN.pack(len(body))]
            else:
                frames = [[W.IN_PIPE, body]]
            kind, payload = await self._call(frames, self.limits.deadline_s, "filtering a batch")
            if kind == W.RAISED:
                await self.kill()
                raise self._failed(f"raised {payload.decode('utf-8', 'replace')}")
            if kind != W.MASK or len(payload) != _CPU.size + count:
                await self.kill()
                raise self._failed(f"its worker answered a malformed reply ({kind!r}, {len(payload)} bytes for "
                                   f"{count} records)")
            mask = payload[_CPU.size:]
            if mask.count(0) + mask.count(1) != count:
                await self.kill()
                raise self._failed("its worker answered a malformed reply (a mask byte other than 0 or 1)")
            self.cpu_used = _CPU.unpack_from(payload)[0]
            return mask

    def _failed(self, cause: str) -> FilterClassFailedError:
        return FilterClassFailedError(f"filter class {self.class_name!r} failed: {cause}",
                                      class_name=self.class_name, cause=cause)

    async def _call(self, frames: list[bytes | list[bytes]], deadline: float, doing: str) -> tuple[bytes, bytes]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(deadline):
                for frame in frames:  # a frame: bytes, or a list of parts sent as one frame (no joined copy)
                    parts = frame if isinstance(frame, list) else [frame]
                    proc.stdin.write(_LEN.pack(sum(map(len, parts))))
                    for part in parts:
                        proc.stdin.write(part)
                await proc.stdin.drain()
                head = await proc.stdout.readexactly(5)
                size = _LEN.unpack_from(head, 1)[0]
                if size > MAX_REPLY:
                    raise ValueError(f"a {size}-byte reply")
                return head[:1], await proc.stdout.readexactly(size)
        except TimeoutError:
            await self.kill()
            raise self._failed(f"exceeded the {deadline:g} s deadline {doing}") from None
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError, ValueError) as exc:
            rc = await self.kill()
            raise self._failed(self._death(rc, exc)) from None

    def _death(self, rc: int | None, exc: Exception) -> str:
        if rc == -signal.SIGXCPU:
            return f"exceeded its CPU limit ({self.limits.cpu_seconds:g} s per batch)"
        if rc is not None and rc < 0:
            # an allocation the address-space limit refused outside Python's MemoryError ends here too
            return f"its worker died of signal {signal.Signals(-rc).name}"
        if rc is not None:
            return f"its worker exited with status {rc}"
        return f"its worker stopped answering ({exc})"

    async def kill(self) -> int | None:
        """End the worker (SIGKILL to its session: anything it spawned too); its exit status."""
        proc = self.proc
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        if proc is None:
            return None
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(5.0):
                return await proc.wait()
        except TimeoutError:
            log.error("filter worker %d of %s did not exit after SIGKILL", proc.pid, self.class_name)
            return None
