"""RocketMQ's Bloom filter for per-consumer filter bitmaps (filter/.../util/BloomFilter.java).

Each (consumer group, topic) owns the k bit positions of the key
``"<group>#<topic>"`` in one shared m-bit space. At dispatch the broker sets a
consumer's bits in a message's bitmap when the message matches its SQL
selector; at pull a message whose bitmap lacks any of the consumer's bits is
skipped without reading the commit log (false positives are removed by full
evaluation afterwards).

Positions (Kirsch-Mitzenmacher): h = MurmurHash3_x64_128(utf-8 key, seed 0)
h1 as a signed long; hash1 = low 32 bits, hash2 = high 32 bits (signed ints);
for i in 1..k: c = hash1 + i*hash2 wrapping at 32 bits, c = ~c if negative,
position = c % m. Bit i lives in byte i // 8 under mask 1 << (i % 8).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mmh3
import numpy as np

from sluice.errors import InvalidParameterError


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


def murmur3_as_long(key: str) -> int:
    """Guava ``Hashing.murmur3_128().hashString(key, UTF_8).asLong()``: h1, signed."""
    return mmh3.hash64(key.encode("utf-8"), 0, signed=True)[0]


@dataclass(frozen=True, slots=True)
class BloomFilterData:
    """A consumer's bit positions and the bitmap size they were computed for (BloomFilterData.java)."""

    bit_pos: tuple[int, ...]
    bit_num: int

    def to_json(self) -> dict[str, object]:
        return {"bitPos": list(self.bit_pos), "bitNum": self.bit_num}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> BloomFilterData:
        return cls(tuple(int(p) for p in data["bitPos"]), int(data["bitNum"]))  # type: ignore[union-attr, arg-type]


class BitsArray:
    """A mutable bit array, least significant bit first within each byte (BitsArray.java)."""

    __slots__ = ("bit_length", "data")

    def __init__(self, bit_length: int, data: bytes | bytearray | None = None) -> None:
        nbytes = (bit_length + 7) // 8
        if data is not None and len(data) != nbytes:
            raise InvalidParameterError(f"{len(data)} bytes cannot hold exactly {bit_length} bits")
        self.bit_length = bit_length
        self.data = bytearray(data) if data is not None else bytearray(nbytes)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray) -> BitsArray:
        return cls(len(data) * 8, data)

    def set_bit(self, index: int, value: bool = True) -> None:
        self._check(index)
        if value:
            self.data[index >> 3] |= 1 << (index & 7)
        else:
            self.data[index >> 3] &= ~(1 << (index & 7)) & 0xFF

    def get_bit(self, index: int) -> bool:
        self._check(index)
        return bool(self.data[index >> 3] & (1 << (index & 7)))

    def _check(self, index: int) -> None:
        if index < 0 or index >= self.bit_length:
            raise InvalidParameterError(f"bit index {index} outside 0..{self.bit_length - 1}")

    def bytes(self) -> bytes:
        return bytes(self.data)

    def __len__(self) -> int:
        return self.bit_length


class BloomFilter:
    """``BloomFilter.createByFn(f, n)``: f = error rate in percent (1..99), n = expected items."""

    def __init__(self, f: int, n: int) -> None:
        if not 1 <= f < 100:
            raise InvalidParameterError(f"f must be greater or equal than 1 and less than 100, got {f}")
        if n < 1:
            raise InvalidParameterError(f"n must be greater than 0, got {n}")
        self.f = f
        self.n = n
        error_rate = f / 100.0
        # Same floating-point steps as the Java code, so k and m agree bit for bit.
        self.k = math.ceil(math.log(error_rate) / math.log(0.5))
        if self.k < 1:
            raise InvalidParameterError(f"error rate {f}% gives k={self.k} < 1")
        m = math.ceil(n * (math.log(1 / error_rate) / math.log(2)) * (math.log(math.e) / math.log(2)))
        self.m = int(8 * math.ceil(m / 8.0))

    @classmethod
    def create_by_fn(cls, f: int, n: int) -> BloomFilter:
        return cls(f, n)

    def calc_bit_positions(self, key: str) -> tuple[int, ...]:
        h = murmur3_as_long(key)
        hash1 = _int32(h)
        hash2 = _int32(h >> 32)
        positions = []
        for i in range(1, self.k + 1):
            combined = _int32(hash1 + i * hash2)
            if combined < 0:
                combined = ~combined
            positions.append(combined % self.m)
        return tuple(positions)

    def generate(self, key: str) -> BloomFilterData:
        """The BloomFilterData of `key` (RocketMQ uses ``group + "#" + topic``)."""
        return BloomFilterData(self.calc_bit_positions(key), self.m)

    def is_valid(self, data: BloomFilterData | None) -> bool:
        return data is not None and data.bit_num == self.m and data.bit_pos is not None and len(data.bit_pos) == self.k

    def _check(self, data: BloomFilterData, bits: BitsArray) -> None:
        if not self.is_valid(data):
            raise InvalidParameterError(f"bloom filter data {data!r} is not valid for k={self.k}, m={self.m}")
        if bits.bit_length != self.m:
            raise InvalidParameterError(f"bits length {bits.bit_length} is not m={self.m}")

    def hash_to(self, data: BloomFilterData | str, bits: BitsArray) -> None:
        """Set the bits of `data` (or of a key string) in `bits`."""
        if isinstance(data, str):
            data = self.generate(data)
        self._check(data, bits)
        for pos in data.bit_pos:
            bits.set_bit(pos)

    def is_hit(self, data: BloomFilterData | str, bits: BitsArray) -> bool:
        """True when every bit of `data` is set in `bits` (the consumer may match)."""
        if isinstance(data, str):
            data = self.generate(data)
        self._check(data, bits)
        return all(bits.get_bit(pos) for pos in data.bit_pos)

    def empty_bits(self) -> BitsArray:
        return BitsArray(self.m)

    # -- batches: one row of m/8 bytes per message -------------------------------------------------
    def _byte_masks(self, data: BloomFilterData) -> tuple[np.ndarray, np.ndarray]:
        if not self.is_valid(data):
            raise InvalidParameterError(f"bloom filter data {data!r} is not valid for k={self.k}, m={self.m}")
        need: dict[int, int] = {}
        for pos in data.bit_pos:
            need[pos >> 3] = need.get(pos >> 3, 0) | (1 << (pos & 7))
        cols = np.fromiter(need.keys(), dtype=np.intp, count=len(need))
        masks = np.fromiter(need.values(), dtype=np.uint8, count=len(need))
        return cols, masks

    def _check_rows(self, bitmaps: np.ndarray) -> None:
        if bitmaps.dtype != np.uint8 or bitmaps.ndim != 2 or bitmaps.shape[1] * 8 != self.m:
            raise InvalidParameterError(
                f"bitmaps must be a 2-D uint8 array with {self.m // 8} bytes per row, got "
                f"{bitmaps.dtype} {bitmaps.shape}")

    def is_hit_batch(self, data: BloomFilterData, bitmaps: np.ndarray) -> np.ndarray:
        """Bool mask over the rows of a (messages x m/8) uint8 array: which rows hold all bits of `data`."""
        self._check_rows(bitmaps)
        cols, masks = self._byte_masks(data)
        return ((bitmaps[:, cols] & masks) == masks).all(axis=1)

    def hash_to_batch(self, data: BloomFilterData, bitmaps: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Set the bits of `data` in the selected rows (a bool mask; all rows if None), in place."""
        self._check_rows(bitmaps)
        cols, masks = self._byte_masks(data)
        if rows is None:
            bitmaps[:, cols] |= masks
        else:
            sel = np.flatnonzero(rows)
            bitmaps[np.ix_(sel, cols)] |= masks

    def __repr__(self) -> str:
        return f"BloomFilter(f={self.f}, n={self.n}, k={self.k}, m={self.m})"
