"""Where the records of a pull body start, and their properties text: one walk per batch, in C where built.

The filter server needs only the boundaries (to count the records its worker must answer for and to cut
the kept ones out of the broker's body, no per-record object for the rest); the worker needs the
properties text too, for the lazy messages it hands the class (sluice/filtersrv/view.py).
``record_spans`` is sluice._speedups.record_spans's Python twin and reference; the C function answers None
for anything unusual and this walk then decodes it or raises ValueError saying what is wrong.
"""
from __future__ import annotations

from array import array

from sluice.errors import SluiceError
from sluice.format import I32, MAGIC_V1, MAGIC_V2, MIN_RECORD_SIZE, POS_SYSFLAG, U32, body_length_pos, read_tail
from sluice.speedups import C

__all__ = ["record_spans", "offsets_of"]


def _py_record_spans(body: bytes | memoryview, with_properties: bool) -> tuple[bytes, list[str] | None]:
    n = len(body)
    starts = array("I")
    texts: list[str] | None = [] if with_properties else None
    pos = 0
    size_at = I32.unpack_from
    while pos < n:
        if n - pos < 4:
            raise ValueError(f"a pull body ends with {n - pos} stray bytes at {pos}")
        size = size_at(body, pos)[0]
        if size < 4 or pos + size > n:
            raise ValueError(f"a record at {pos} claims {size} bytes, the body has {n - pos}")
        starts.append(pos)
        if texts is not None:
            if size < MIN_RECORD_SIZE:
                raise ValueError(f"a record at {pos} is {size} bytes, shorter than any record ({MIN_RECORD_SIZE})")
            magic = U32.unpack_from(body, pos + 4)[0]
            if magic not in (MAGIC_V1, MAGIC_V2):
                raise ValueError(f"a record at {pos} has the bad magic code 0x{magic:08X}")
            try:
                texts.append(read_tail(body, pos, size, magic,
                                       pos + body_length_pos(I32.unpack_from(body, pos + POS_SYSFLAG)[0]), None, 0)[3])
            except SluiceError as exc:
                raise ValueError(f"a record at {pos} does not decode: {exc}") from None
        pos += size
    starts.append(n)
    return starts.tobytes(), texts


def record_spans(body: bytes | memoryview, with_properties: bool = False) -> tuple[bytes, list[str] | None]:
    """(offsets, texts): ``offsets`` the native uint32 start of each record of ``body`` then ``len(body)``
    (read it with ``memoryview(offsets).cast("I")``); ``texts`` each record's properties text with
    ``with_properties``, else None. ValueError when the body is not whole records."""
    if C is not None:
        got = C.record_spans(body, with_properties)
        if got is not None:
            return got
    return _py_record_spans(body, with_properties)


def offsets_of(body: bytes | memoryview) -> memoryview:
    """The records' starts and the body's end (n + 1 values, indexable as ints)."""
    return memoryview(record_spans(body)[0]).cast("I")
