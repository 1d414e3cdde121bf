"""The rows a pull reads from a ConsumeQueueExt: ExtBatch (numpy arrays, get_many) and FewExtBatch (Python
lists for a few units, get_few, arrays built only when asked for)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["ExtBatch", "FewExtBatch"]


@dataclass(frozen=True, slots=True)
class ExtBatch:
    """get_many's answer, row i for address i. Unpacks as ``tags_codes, bitmaps = batch``.

    A row whose address is not an ext address, not (or no longer) stored or not a sound unit has
    ``valid`` False, tag code 0 and an all-zero bitmap; RocketMQ lets such a message through the
    filter. ``bitmaps`` rows are zero-padded to the longest bitmap; ``bitmap_lengths`` has the real ones.
    """

    tags_codes: np.ndarray       # int64
    bitmaps: np.ndarray          # uint8, shape (n, longest bitmap)
    bitmap_lengths: np.ndarray   # int32
    msg_store_times: np.ndarray  # int64
    valid: np.ndarray            # bool

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.tags_codes, self.bitmaps))

    def __len__(self) -> int:
        return len(self.tags_codes)

    @property
    def width(self) -> int:
        """The bitmap rows' width in bytes (the longest bitmap)."""
        return int(self.bitmaps.shape[1])

    def row_lists(self) -> tuple[list[bool], list[int], list[int], bytes]:
        """``valid``, ``bitmap_lengths`` and ``msg_store_times`` as lists and the bitmap rows as one bytes
        string (rows of ``width`` bytes): what a few-unit filter reads (broker/filtering.py)."""
        return (self.valid.tolist(), self.bitmap_lengths.tolist(), self.msg_store_times.tolist(),
                self.bitmaps.tobytes())


class FewExtBatch:
    """get_few's batch: an ExtBatch's rows kept as the Python lists they were read into, the numpy arrays
    built only when one is asked for. A woken or keeping-up pull's filter reads the lists (``row_lists``),
    so the arrays, whose fixed costs outweigh a few units' work, are mostly never built."""

    __slots__ = ("_tags", "_valid", "_lengths", "_times", "_rows", "width", "_arrays")

    def __init__(self, tags: list[int], valid: list[bool], lengths: list[int], times: list[int], rows: bytes,
                 width: int) -> None:
        self._tags, self._valid, self._lengths, self._times = tags, valid, lengths, times
        self._rows, self.width = rows, width
        self._arrays: ExtBatch | None = None

    def arrays(self) -> ExtBatch:
        """The same batch as an ExtBatch (built once)."""
        a = self._arrays
        if a is None:
            n, width = len(self._tags), self.width
            a = self._arrays = ExtBatch(
                np.array(self._tags, dtype=np.int64),
                np.frombuffer(self._rows, dtype=np.uint8).reshape(n, width).copy(),
                np.array(self._lengths, dtype=np.int32), np.array(self._times, dtype=np.int64),
                np.array(self._valid, dtype=bool))
        return a

    def row_lists(self) -> tuple[list[bool], list[int], list[int], bytes]:
        """ExtBatch.row_lists, without building an array."""
        return self._valid, self._lengths, self._times, self._rows

    @property
    def tags_codes(self) -> np.ndarray:
        return self.arrays().tags_codes

    @property
    def bitmaps(self) -> np.ndarray:
        return self.arrays().bitmaps

    @property
    def bitmap_lengths(self) -> np.ndarray:
        return self.arrays().bitmap_lengths

    @property
    def msg_store_times(self) -> np.ndarray:
        return self.arrays().msg_store_times

    @property
    def valid(self) -> np.ndarray:
        return self.arrays().valid

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.arrays())

    def __len__(self) -> int:
        return len(self._tags)
