"""Fixed-size files mapped into memory, and the ordered queue of them that makes one log.

A file is named by the log offset of its first byte, zero-padded to 20 digits
(RocketMQ's UtilAll.offset2FileName). Files are created at full size, sparse,
so untouched bytes read as zeros: a zero where a length should be ends the data.

No write through a mapping ever lands on unallocated space: a store of a sparse page
that the filesystem cannot back (ENOSPC) kills the process with SIGBUS, and on tmpfs even a
read of a hole allocates. Each file keeps ``alloc_end``: every byte below it is allocated
(``os.posix_fallocate``, or data the file held when opened). ``write`` allocates ahead, in
chunks, before it stores past it, and fails with DiskFullError (the caller's request fails,
nothing is written); readers stay below the data they know was written, and scans below
``alloc_end``.
Writes go through a shared mmap; durability is ``os.fdatasync`` on the file's
descriptor (on Linux that writes back the mapping's dirty pages, and unlike
``mmap.flush`` it releases the GIL so appends continue during an fsync).

A commit log under synchronous flush writes with ``pwrite`` instead
(FdWrittenFile) and reads through the mapping as before (Linux keeps the two
coherent: one page cache). An fsync right after writes through a mapping costs
several times more than after the same bytes written with pwrite, as the
kernel must write-protect each written page of the mapping again (docs/store.md
has the figures).
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sluice.errors import DiskFullError, StoreError
from sluice.speedups import C

log = logging.getLogger(__name__)

_ZERO_CHUNK = bytes(1 << 20)


def offset_to_name(offset: int) -> str:
    return f"{offset:020d}"


#: bytes allocated at a time ahead of writes, unless a file says otherwise (small files stay sparse-cheap)
ALLOC_CHUNK = 64 * 1024


def data_end(fd: int, size: int) -> tuple[int, int]:
    """(the first hole, the end of the last data region) of an open file, both capped at ``size``.

    SEEK_DATA/SEEK_HOLE walk the extents without reading them; where they are not supported the whole
    file counts as data (Linux's generic lseek does that)."""
    try:
        first_hole = os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return size, size
    end, pos = 0, 0
    try:
        while pos < size:
            d = os.lseek(fd, pos, os.SEEK_DATA)
            pos = os.lseek(fd, d, os.SEEK_HOLE)
            end = pos
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: no data after pos
            return size, size
    return min(first_hole, size), min(end, size)


def allocate(fd: int, pos: int, n: int, path: Path) -> None:
    """Allocate bytes [pos, pos + n) of ``fd`` for real; DiskFullError on ENOSPC, StoreError if refused."""
    try:
        os.posix_fallocate(fd, pos, n)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"service not available now, maybe disk full: cannot allocate {n} bytes at {pos} "
                                f"of {path}: {e.strerror}") from None
        raise StoreError(f"the filesystem refuses to allocate {n} bytes at {pos} of {path} (posix_fallocate: "
                         f"{e.strerror}); Sluice needs allocated files so that a full disk cannot kill it with "
                         "SIGBUS: put the store on ext4, xfs or tmpfs") from None


class MappedFile:
    """One fixed-size file mapped read/write."""

    __slots__ = ("path", "start", "size", "_fd", "mm", "closed", "alloc_end", "alloc_chunk")

    def __init__(self, path: Path, start: int, size: int, *, flags: int = os.O_RDWR | os.O_CREAT,
                 owner: str = "log", alloc_chunk: int = ALLOC_CHUNK) -> None:
        """Open (``flags``) and map ``path``; ``owner`` names what its files belong to in the size error.

        A new file is allocated its first ``alloc_chunk`` bytes at once (a file that cannot get them is
        removed again: DiskFullError); an existing one counts its data as allocated (holes below the last
        data, left by older versions, are allocated now)."""
        self.path = path
        self.start = start
        self.size = size
        self.alloc_chunk = alloc_chunk
        existed = os.path.exists(path)
        fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(fd).st_size
            if actual > size:
                raise StoreError(f"{path} is {actual} bytes; files of this {owner} are {size} bytes")
            hole, end = data_end(fd, actual) if actual else (0, 0)
            if hole < end:
                allocate(fd, hole, end - hole, path)
            if not existed or actual == 0:
                end = min(size, alloc_chunk)
                allocate(fd, 0, end, path)
            if actual < size:
                # A crash between create and resize leaves a short file; its missing bytes were never written.
                os.ftruncate(fd, size)
            self.alloc_end = end
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if not existed:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            raise
        self._fd = fd
        self.closed = False

    def allocate_to(self, end: int) -> None:
        """Make bytes below ``end`` allocated (in ``alloc_chunk`` steps, never past the file's end)."""
        if end <= self.alloc_end:
            return
        stop = min(self.size, max(end, self.alloc_end + self.alloc_chunk))
        allocate(self._fd, self.alloc_end, stop - self.alloc_end, self.path)
        self.alloc_end = stop

    @property
    def end(self) -> int:
        return self.start + self.size

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        end = pos + len(data)
        if end > self.alloc_end:
            self.allocate_to(end)
        self.mm[pos:end] = data

    def read(self, pos: int, n: int) -> bytes:
        return self.mm[pos:pos + n]

    def release(self, pos: int, end: int) -> None:
        """Drop the mapping's pages of [pos, end) from this process (MADV_DONTNEED; the data stays in the
        file and page cache): scans of whole files keep the resident set bounded."""
        a = pos - pos % mmap.PAGESIZE
        b = min(self.size, -(-end // mmap.PAGESIZE) * mmap.PAGESIZE)
        if b > a and not self.closed:
            try:
                self.mm.madvise(mmap.MADV_DONTNEED, a, b - a)
            except (ValueError, OSError):  # closed meanwhile: nothing resident to drop
                pass

    def read_released(self, pos: int, n: int) -> bytes:
        """A copy of ``n`` bytes at ``pos`` whose pages are then released (for scans, not the hot path)."""
        data = self.mm[pos:pos + n]
        self.release(pos, pos + n)
        return data

    def zero(self, pos: int, end: int | None = None) -> None:
        """Zero bytes [pos, end) (to the file's end by default), skipping chunks that are zero already."""
        end = self.size if end is None else min(end, self.size)
        end = min(end, self.alloc_end)  # beyond it nothing was ever written: zeros, and reading could allocate
        while pos < end:
            n = min(len(_ZERO_CHUNK), end - pos)
            if self.mm[pos:pos + n] != _ZERO_CHUNK[:n]:
                self.mm[pos:pos + n] = _ZERO_CHUNK[:n]
            pos += n

    def sync(self) -> None:
        if not self.closed:
            os.fdatasync(self._fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.mm.close()
        except BufferError:
            # A reader still holds a view; the mapping goes away with its last reference.
            log.debug("mapping of %s still exported at close", self.path)
        os.close(self._fd)

    def delete(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def _pwrite_py(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    """Write all of ``data`` at ``pos`` (the reference for C.pwrite_all, which keeps the GIL)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n


class FdWrittenFile(MappedFile):
    """A MappedFile whose writes go through its descriptor (``pwrite``); reads still use the mapping."""

    __slots__ = ()

    # C's keeps the GIL (a copy of a few KiB into the page cache): with many threads waiting for the
    # GIL, taking it back after os.pwrite costs more than the write.
    _pwrite = staticmethod(C.pwrite_all if C is not None else _pwrite_py)

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        end = pos + len(data)
        if end > self.alloc_end:
            self.allocate_to(end)
        self._pwrite(self._fd, data, pos)


F = TypeVar("F", bound=MappedFile)


def open_file_run(directory: Path, file_size: int, open_file: Callable[[Path, int, int], F], *,
                  size_name: str = "file size") -> list[F]:
    """Open a log's files (20-digit names, the offset of their first byte) in order.

    Each must start at a multiple of ``file_size`` and where the one before ends; on any error the
    files opened so far are closed again.
    """
    if not directory.is_dir():
        return []
    names = sorted(p for p in directory.iterdir() if p.is_file() and p.name.isdigit() and len(p.name) == 20)
    files: list[F] = []
    try:
        for p in names:
            start = int(p.name)
            if start % file_size:
                raise StoreError(f"{p} does not start at a multiple of the {size_name} {file_size}")
            if files and start != files[-1].end:
                raise StoreError(f"{p} does not follow {files[-1].path}: a file is missing")
            files.append(open_file(p, start, file_size))
    except BaseException:
        for f in files:
            f.close()
        raise
    return files


class MappedFileQueue:
    """The ordered, contiguous files of one log (the commit log or one consume queue)."""

    def __init__(self, directory: Path, file_size: int, *, write_by_fd: bool = False,
                 alloc_chunk: int = ALLOC_CHUNK) -> None:
        self.directory = directory
        self.file_size = file_size
        self.alloc_chunk = alloc_chunk
        self._file_class = FdWrittenFile if write_by_fd else MappedFile
        self.files: list[MappedFile] = []
        # Guards the list itself (roll-over, retention, truncation); data access needs no lock.
        self.lock = threading.RLock()

    def load(self) -> None:
        if not self.directory.is_dir():
            return
        self.files = open_file_run(self.directory, self.file_size, self._open_file)

    def _open_file(self, path: Path, start: int, size: int) -> MappedFile:
        return self._file_class(path, start, size, alloc_chunk=self.alloc_chunk)

    @property
    def min_offset(self) -> int:
        files = self.files
        return files[0].start if files else 0

    @property
    def end_offset(self) -> int:
        files = self.files
        return files[-1].end if files else 0

    def last(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding log offset ``offset``, or None when it is not (or no longer) stored."""
        files = self.files
        if not files:
            return None
        i = (offset - files[0].start) // self.file_size
        if 0 <= i < len(files):
            f = files[i]
            if f.start <= offset < f.end:
                return f
        return None

    def create(self, start: int) -> MappedFile:
        """Append a new file beginning at ``start`` (the next file, or the first one of an empty log)."""
        with self.lock:
            if start % self.file_size:
                raise StoreError(f"file start {start} is not a multiple of {self.file_size}")
            if self.files and start != self.files[-1].end:
                raise StoreError(f"new file at {start} would not follow {self.files[-1].path}")
            self.directory.mkdir(parents=True, exist_ok=True)
            f = self._open_file(self.directory / offset_to_name(start), start, self.file_size)
            self.files = self.files + [f]
            return f

    def truncate(self, offset: int, dirty_end: int | None = None) -> None:
        """Forget everything at and after ``offset``: later files are deleted, the rest of its file zeroed.

        ``dirty_end`` bounds how far the zeroing has to look, when the caller knows where data ended.
        """
        with self.lock:
            keep = [f for f in self.files if f.start <= offset]
            for f in self.files[len(keep):]:
                f.delete()
            if keep and offset < keep[-1].end:
                f = keep[-1]
                end = None if dirty_end is None else max(0, dirty_end - f.start)
                f.zero(offset - f.start, end)
            if keep and offset == keep[-1].start and len(keep) > 1:
                keep[-1].delete()
                keep = keep[:-1]
            self.files = keep

    def delete_first(self, count: int) -> list[Path]:
        with self.lock:
            gone = self.files[:count]
            self.files = self.files[count:]
        for f in gone:
            f.delete()
        return [f.path for f in gone]

    def sync(self, start: int, end: int) -> None:
        """fdatasync the files that hold bytes [start, end)."""
        with self.lock:  # retention must not close a file under an fsync
            for f in self.files:
                if f.end > start and f.start < end:
                    f.sync()

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
            self.files = []

    def destroy(self) -> None:
        with self.lock:
            for f in self.files:
                f.delete()
            self.files = []
