"""Files replaced whole, durably: the one atomic-write helper, and small JSON documents built on it.

:func:`write_atomic` writes a temp file in the target's directory, fsyncs it, renames it over the target
and fsyncs the directory, so a crash leaves either the old content or the new, never a mix, and the
rename itself survives a power loss. Used for the store's checkpoint and layout file, the broker's
JSON documents (topic configs, offsets, filter data) and backfill bitmaps, and the Spark jobs' files.
A bottom-layer module: it imports nothing from sluice.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

__all__ = ["JsonSaver", "fsync_dir", "read_json", "write_atomic", "write_json_atomic"]

log = logging.getLogger(__name__)

_serial = itertools.count()  # with the pid, a temp name no other writer of the same file uses


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (a rename, a new or removed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, write, flush, fsync, os.replace,
    then fsync the directory. On any failure the temp file is removed and ``path`` is left as it was."""
    path = Path(path)
    # Hidden, and unique per process and call: concurrent writers of one path never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def json_bytes(data: Any) -> bytes:
    """``data`` as the indented JSON the config files hold; int keys are written as strings."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as indented JSON (write_atomic), creating its directory if needed."""
    write_json_bytes_atomic(path, json_bytes(data))


def write_json_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with JSON serialised already (:func:`json_bytes`), creating its directory if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def read_json(path: Path, default: Any = None) -> Any:
    """Read a document written by write_json_atomic; a missing file gives ``default``.

    A damaged file is moved aside (``.bad``) and reported, so the broker starts
    with what it can trust instead of refusing to start.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        log.error("%s is not valid JSON (%s); moved to %s and starting without it", path, e, bad)
        return default


#: How long the saver thread lets a change rest before writing it (JsonSaver.soon): the request that made it
#: (a client's heartbeat auto-creating its group and retry topic) and the ones that follow (its routes,
#: consumer list and offsets) are answered first, since each Python step of a write between its system
#: calls takes the GIL from the event loop, and the changes of the burst go in one write.
SOON_DELAY_S = 0.05


class JsonSaver:
    """One JSON document saved whole from ``snapshot()``: :meth:`now` writes before returning; :meth:`soon`
    leaves the write to a daemon thread, ``delay_s`` later, coalescing the changes made meanwhile into one write.

    ``soon`` is for what a crash may lose because it is made again (a group or retry topic auto-created by a
    client's heartbeat): the caller, often an event loop, never waits on the fsyncs. ``lock`` is the table's
    own (reentrant) lock: each snapshot is taken under it and numbered, and a write older than the last one
    written is skipped, so the file always ends with the latest state whichever path wrote last. The lock is
    never held while waiting for a write, except by a caller of :meth:`now` that holds it already.
    :meth:`flush` (at shutdown) writes what is pending.
    """

    def __init__(self, path: Path, snapshot: Callable[[], Any], lock: threading.RLock,
                 name: str = "json-saver", *, delay_s: float = SOON_DELAY_S) -> None:
        self.path = path
        self.delay_s = delay_s
        self._snapshot = snapshot
        self._lock = lock
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending = False
        self._taken = 0  # number of the last snapshot taken (under self._lock)
        self._written = 0  # number of the last snapshot on disk (under self._write_lock)
        self._thread: threading.Thread | None = None
        self._name = name
        #: Background writes that failed (each logged); the next change tries again.
        self.failures = 0

    def now(self) -> None:
        self._write(*self._take())

    def soon(self) -> None:
        with self._cond:
            self._pending = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self) -> None:
        """Write now what a :meth:`soon` left pending or is writing (broker stop)."""
        with self._cond:
            pending, self._pending = self._pending, False
        if pending or self._thread is not None:  # also waits out a background write under way
            self.now()

    def _take(self) -> tuple[int, Any]:
        with self._lock:
            self._taken += 1
            return self._taken, self._snapshot()

    def _write(self, number: int, data: Any) -> None:
        with self._write_lock:
            if number <= self._written:  # a later snapshot is on disk already
                return
            write_json_atomic(self.path, data)
            self._written = number

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
            time.sleep(self.delay_s)  # (SOON_DELAY_S) changes made meanwhile go in the same write
            with self._cond:
                if not self._pending:  # flush() wrote them meanwhile (the broker's stop)
                    continue
                self._pending = False
            try:
                self._write(*self._take())
            except OSError as exc:
                self.failures += 1
                log.error("could not save %s (kept in memory, written with the next change): %s",
                          self.path, exc)
