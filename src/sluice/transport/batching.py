"""Write batches and after-read work: what one event-loop iteration writes leaves together.

A connection's frames wait in its ``_wbuf`` for one flush per iteration. A write
batch (:func:`begin_writes` / :func:`end_writes`) moves that flush earlier, to
the end of the code that opened it: every read opens one (:func:`handle_read`),
so answers written on any connection while a read's frames are handled (a send
waking a held pull on another connection, say) leave at the end of that read,
not one iteration later; the loop thread of the blocking SDK opens one around
the calls other threads hand it. Work a request queues with :func:`after_read`
runs right after the read's frames, still in that iteration (the broker's
merged appends), instead of an iteration later through ``call_soon``.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["after_read", "begin_writes", "current_batch", "end_writes", "handle_read"]

log = logging.getLogger(__name__)

class Flushable(Protocol):
    """What a write batch needs of a connection (RemotingConnection)."""

    _flush_scheduled: bool

    def _flush(self) -> None: ...


_writes = threading.local()  # the open write batch (begin_writes), if any


class _Reading(threading.local):
    after: list[Callable[[], object]] | None = None  # what after_read() queued during the read being handled


_reading = _Reading()


def current_batch() -> list[Flushable] | None:
    """The write batch open on this thread (a connection with frames to flush joins it), else None."""
    return getattr(_writes, "batch", None)


def handle_read(receive: Callable[[bytes], None], data: bytes) -> None:
    """``receive(data)`` (a connection handling the frames of one read) inside a write batch, then the work
    its requests queued with :func:`after_read`. A read handled inside another's (a handler reading on a
    second connection) leaves the after-read work to the outer one."""
    outer = _reading.after
    if outer is None:
        after: list[Callable[[], object]] = []
        _reading.after = after
    batch = begin_writes()
    try:
        receive(data)
    finally:
        end_writes(batch)
        if outer is None:
            _reading.after = None
            for callback in after:
                try:
                    callback()
                except Exception:  # as the loop would log a failed callback
                    log.exception("after-read callback %r failed", callback)


def after_read(callback: Callable[[], object]) -> bool:
    """Queue ``callback()`` to run once the read being handled on this thread has dispatched all its frames and
    written their answers (still in this loop iteration, before its next poll): work one request starts that
    the other requests of the same read may share (the broker's merged appends). The callbacks run outside any
    write batch: one that writes opens its own (:func:`begin_writes`). False, and nothing queued, outside a
    read (or while the queued callbacks run): the caller schedules it itself."""
    after = _reading.after
    if after is None:
        return False
    after.append(callback)
    return True


def begin_writes() -> list[Flushable] | None:
    """Open a write batch on this thread: frames written on its connections until :func:`end_writes` leave
    there, in one transport write per connection, rather than at the next loop iteration (one iteration, an
    epoll_wait and a GIL release fewer). LoopThread opens one around the calls it takes from other threads.
    None (and end_writes does nothing) when one is open already."""
    if getattr(_writes, "batch", None) is not None:
        return None
    batch: list[Flushable] = []
    _writes.batch = batch
    return batch


def end_writes(batch: list[Flushable] | None) -> None:
    """Close the batch :func:`begin_writes` opened, writing what its connections collected."""
    if batch is None:
        return
    _writes.batch = None
    for conn in batch:
        if conn._flush_scheduled:
            conn._flush()
