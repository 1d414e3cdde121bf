"""Commit-log fsyncs asked for without waiting: a thread syncs, an eventfd says when (for an event loop).

The broker appends on its event loop under synchronous flush and answers once the bytes are durable.
:class:`BackgroundFlush` gives it three calls: ``request()`` after a loop iteration's appends (returns at
once), ``fileno()`` to watch (readable when a round ended) and ``collect()`` for what is durable now.
Each round fdatasyncs everything appended before it started, so a round started while another runs covers
all the requests made meanwhile (group commit: RocketMQ's GroupCommitService in
store/src/main/java/org/apache/rocketmq/store/CommitLog.java).

The thread is the C extension's ``Syncer`` when built: it never takes the GIL, so a round starts as soon
as it is asked for, while the loop goes on with its iteration (replies, dispatch), and its end wakes the
loop through the eventfd alone. :class:`PySyncer` is its reference and fallback, a Python thread with the
same behaviour (it needs the GIL to start and to report each round).

Only a round that started after a request claims that request's offset: ``request()`` asks for the
commit log's write position as it is then, and a round in flight reports only what it was started for.
"""
from __future__ import annotations

import errno as _errno
import os
import threading
import time
from collections import deque

from sluice.errors import FlushDiskTimeoutError
from sluice.speedups import C
from sluice.store.flush import FlushService

__all__ = ["BackgroundFlush", "PySyncer", "MAX_FDS"]

#: files one request may name (C's MAX_FDS): a round spans one or two commit-log segments
MAX_FDS = 8


class PySyncer:
    """The reference of ``sluice._speedups.Syncer``: fdatasyncs requested files on a thread of its own and
    writes 1 to ``notify_fd`` (an eventfd) after each round."""

    def __init__(self, notify_fd: int) -> None:
        self._notify_fd = notify_fd
        self._cond = threading.Condition()
        self._want = 0  # the highest offset asked for
        self._taken = 0  # the highest offset a round started for
        self._done = 0  # the highest offset a successful round covered
        self._failed: tuple[int, int] | None = None  # (upto, errno) of the last failed round not taken yet
        self._fds: list[int] = []  # duplicates of the newest request's files not taken yet (owned)
        self._rounds = 0
        self._sync_ns = 0
        self._idle = False
        self._stopping = False
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="sluice-group-commit",
                                                                  daemon=True)
        self._thread.start()

    def request(self, want: int, fds: tuple[int, ...]) -> None:
        """Ask that ``fds`` be fdatasynced for offset ``want``; see the C docstring."""
        if type(fds) is not tuple:
            raise TypeError(f"request() argument 2 must be tuple, not {type(fds).__name__}")
        if self._thread is None or self._stopping:
            raise ValueError("the syncer is closed")
        if len(fds) > MAX_FDS:
            raise ValueError(f"at most {MAX_FDS} files per request, not {len(fds)}")
        dups: list[int] = []
        try:
            for fd in fds:
                if fd < 0 or fd > 0x7FFFFFFF:
                    raise OSError(_errno.EBADF, os.strerror(_errno.EBADF))
                dups.append(os.dup(fd))
        except BaseException:
            _close_all(dups)
            raise
        old: list[int] = []
        with self._cond:
            if want > self._want:
                old, self._fds = self._fds, dups
                dups = []
                self._want = want
                if self._idle:
                    self._cond.notify()
        _close_all(old)
        _close_all(dups)

    def take_error(self) -> tuple[int, int] | None:
        """The last failed round (its offset, fdatasync's errno) since the last call, or None."""
        with self._cond:
            failed, self._failed = self._failed, None
        return failed

    @property
    def done(self) -> int:
        return self._done

    @property
    def rounds(self) -> int:
        return self._rounds

    @property
    def sync_ns(self) -> int:
        """Nanoseconds spent in fdatasync over all rounds."""
        return self._sync_ns

    def close(self) -> None:
        """Let the thread finish the rounds asked for, then end it."""
        t = self._thread
        if t is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        t.join()
        self._thread = None

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._want <= self._taken and not self._stopping:
                    self._idle = True
                    cond.wait()
                    self._idle = False
                if self._want <= self._taken:
                    return  # stopping, and everything asked for had its round
                want, fds, self._fds = self._want, self._fds, []
                self._taken = want
            err = 0
            t0 = time.monotonic_ns()
            for fd in fds:
                try:
                    os.fdatasync(fd)
                except OSError as e:
                    err = err or e.errno or _errno.EIO
                os.close(fd)
            spent = time.monotonic_ns() - t0
            with cond:
                self._sync_ns += spent
                if err:
                    self._failed = (want, err)
                elif want > self._done:
                    self._done = want
                self._rounds += 1
            os.eventfd_write(self._notify_fd, 1)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


class BackgroundFlush:
    """Group commit for one event loop (see the module doc). ``request``, ``collect`` and ``release`` run
    on the loop's thread; ``close`` may run anywhere."""

    def __init__(self, flusher: FlushService, *, use_c: bool | None = None) -> None:
        """``use_c``: the C thread (default: when the extension is built) or PySyncer."""
        self.flusher = flusher
        self.commitlog = flusher.commitlog
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        if use_c is None:
            use_c = C is not None
        try:
            self._syncer = C.Syncer(self._efd) if use_c and C is not None else PySyncer(self._efd)
        except BaseException:
            os.close(self._efd)
            raise
        self._asked = 0  # the highest offset requested
        self._stamps: deque[tuple[int, int]] = deque()  # (offset requested, store time of its last record)
        self._rounds_seen = 0

    def fileno(self) -> int:
        """Readable once a round ended: then call :meth:`collect`."""
        return self._efd

    @property
    def durable(self) -> int:
        """Commit-log bytes below this offset are durable."""
        return self.flusher.flushed_offset

    def request(self) -> bool:
        """Ask for everything appended so far to be made durable. False when it is already (no round will
        report for it), True when a round will (one running now covers only what it started for)."""
        cl = self.commitlog
        target = cl.write_pos  # every byte below it is in the page cache already
        ts = cl.last_store_timestamp
        if target <= self.flusher.flushed_offset:
            return False
        if target > self._asked:
            for _ in range(3):
                try:
                    self._syncer.request(target, self._fds(self.flusher.flushed_offset, target))
                    break
                except OSError:  # a segment closed under us (retention, flushed meanwhile): look again
                    continue
            else:
                self.flusher.flush()  # (never seen) make it durable here, and let an empty round report it
                self._syncer.request(target, ())
            self._asked = target
            self._stamps.append((target, ts))
        return True

    def _fds(self, start: int, end: int) -> tuple[int, ...]:
        """The descriptors of the segments holding bytes [start, end); none after a synchronous flush when
        there are more than the syncer takes (a backlog of appends nobody asked durable: not in practice).

        The segment list is read without its lock, which a checkpoint holds through its fsync (the loop
        must not wait for that): the list is replaced whole when it changes, and retention closes only
        segments wholly below the flushed offset. One closed meanwhile makes the syncer's dup fail
        (OSError), and ``request`` looks again."""
        picked: list[int] = []
        for f in reversed(self.commitlog.queue.files):  # the newest segments: usually the last one alone
            if f.end <= start:
                break
            if f.start < end and not f.closed:
                picked.append(f._fd)
        fds = tuple(reversed(picked))
        if len(fds) > MAX_FDS:
            self.flusher.flush()  # covers ``end``: every byte below it was appended before
            return ()
        return fds

    @property
    def rounds(self) -> int:
        """Rounds the thread ran (successful or not)."""
        return self._syncer.rounds

    @property
    def sync_ns(self) -> int:
        """Nanoseconds the thread spent in fdatasync (the disk's part of the waits)."""
        return self._syncer.sync_ns

    def collect(self) -> tuple[int, list[tuple[int, FlushDiskTimeoutError]]]:
        """(the offset below which everything is durable, failed rounds as (offset, FlushDiskTimeoutError)): call when
        :meth:`fileno` is readable, or any time. A failed round's offset is not durable, whatever later
        rounds report: its replies must get the error."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        s = self._syncer
        failed = s.take_error()
        errors: list[tuple[int, FlushDiskTimeoutError]] = []
        if failed is not None:  # stored, not confirmed durable: RocketMQ answers FLUSH_DISK_TIMEOUT
            upto, code = failed
            errors.append((upto, FlushDiskTimeoutError(f"commit log fsync failed: [Errno {code}] "
                                                       f"{os.strerror(code)}")))
        done = s.done
        rounds = s.rounds
        flusher = self.flusher
        stamps = self._stamps
        ts = None
        while stamps and stamps[0][0] <= done:
            ts = stamps.popleft()[1]
        if failed is not None:
            while stamps and stamps[0][0] <= failed[0]:
                stamps.popleft()
        flusher.note_flushed(done, ts, rounds - self._rounds_seen)
        self._rounds_seen = rounds
        return flusher.flushed_offset, errors

    def close(self) -> None:
        """Stop the thread once the rounds asked for are done (then :meth:`collect` reports them)."""
        self._syncer.close()

    def release(self) -> None:
        """Close the eventfd (after :meth:`close` and the last :meth:`collect`)."""
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1
