"""The key index's hash: abs(Java ``String.hashCode`` of ``topic + "#" + key``), one key or a batch at once.

RocketMQ's IndexFile.indexKeyHashMethod takes Java's hash (UTF-16 code units,
mod 2**32, signed), then its absolute value, Integer.MIN_VALUE mapping to 0.
The hash is a polynomial, so hash(a + b) = hash(a) * 31**len(b) + hash(b)
(mod 2**32, len in UTF-16 units): the ``topic#`` part is worked out once per
topic and only the keys themselves are hashed.

Dispatch hashes a whole batch's keys with :func:`key_hashes`: every code unit of
every key times 31**(its distance from its key's end), summed per key with
``np.add.reduceat``; uint32 arithmetic wraps exactly like Java's int, with no
Python loop over characters (docs/store.md has the figures).
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from functools import lru_cache

import numpy as np


__all__ = ["key_hash", "key_hashes", "prefix_hash"]

_MASK = 0xFFFFFFFF
_pow_table = np.ones(1, dtype=np.uint32)  # 31**k mod 2**32, grown on demand


def _java_hash(s: str) -> int:
    """Java's String.hashCode as an unsigned 32-bit int (UTF-16 code units, lone surrogates included).

    Summed as a Python int and cut to 32 bits once at the end: mod 2**32 commutes with + and *."""
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = h * 31 + c
        return h & _MASK
    units = array("H", s.encode("utf-16-be", "surrogatepass"))
    if sys.byteorder == "little":
        units.byteswap()
    for c in units:
        h = h * 31 + c
    return h & _MASK


@lru_cache(maxsize=4096)
def prefix_hash(topic: str) -> int:
    """Java hash of ``topic + "#"`` as an unsigned 32-bit int."""
    return _java_hash(topic + "#") & _MASK


@lru_cache(maxsize=256)
def _pow31(n: int) -> int:
    return pow(31, n, 1 << 32)


def _finish(h: int) -> int:
    if h & 0x80000000:
        h -= 1 << 32
    return 0 if h == -(1 << 31) else abs(h)


def _units(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-16-be", "surrogatepass")) // 2


def key_hash(topic: str, key: str) -> int:
    """abs(Java hashCode of ``topic + "#" + key``), Integer.MIN_VALUE mapping to 0 (IndexFile.indexKeyHashMethod)."""
    return _finish((prefix_hash(topic) * _pow31(_units(key)) + _java_hash(key)) & _MASK)


def _powers(n: int) -> np.ndarray:
    """31**k mod 2**32 for k in 0..n-1 (at least)."""
    global _pow_table
    table = _pow_table
    if len(table) < n:
        size = max(n, 2 * len(table), 256)
        table = np.empty(size, dtype=np.uint32)
        table[0] = 1
        acc = 1
        # Once per size: a Python loop over at most the longest key seen.
        for k in range(1, size):
            acc = acc * 31 & _MASK
            table[k] = acc
        _pow_table = table
    return table


def _finish_array(prefixes: np.ndarray, lens: np.ndarray | int, h: np.ndarray) -> np.ndarray:
    table = _powers(int(np.max(lens)) + 1)
    full = np.asarray(prefixes, dtype=np.uint32) * table[lens] + h
    signed = full.view(np.int32).astype(np.int64)
    return np.where(signed == -(1 << 31), 0, np.abs(signed))


def _rows(codes: np.ndarray, length: int) -> np.ndarray:
    """Java hashes of equally long keys, one key per row of ``codes`` (code units): a matrix product.

    ASCII units (< 2**7) times weights (< 2**32) summed over at most 2**14 of them stay below 2**53, so
    float64 (BLAS) is exact; the sum then wraps to 32 bits like Java's int. Longer keys use uint32."""
    weights = _powers(length)[length - 1::-1]  # 31**(length-1) .. 31**0
    if length <= 1 << 14 and codes.dtype == np.uint8:
        return (codes.astype(np.float64) @ weights.astype(np.float64)).astype(np.uint64).astype(np.uint32)
    return codes.astype(np.uint32) @ weights


def _ragged(codes: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Java hashes of keys of any lengths (code units back to back): each unit times 31**(its distance
    from its key's end), summed per key."""
    ends = np.cumsum(lens)
    table = _powers(int(lens.max()) + 1)
    exps = np.repeat(ends - 1, lens) - np.arange(len(codes), dtype=np.int64)
    return np.add.reduceat(codes.astype(np.uint32) * table[exps], ends - lens, dtype=np.uint32)


#: keys of at most this many distinct lengths are hashed one matrix product per length
_MAX_LENGTH_GROUPS = 16


def key_hashes(prefixes: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """key_hash for many keys at once: ``prefixes[i]`` is prefix_hash(topic of key i) (uint32), keys non-empty.

    Returns int64 hashes, each in 0..2**31-1.
    """
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    joined = "".join(keys)
    if joined.isascii():
        codes = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        lens_l = list(map(len, keys))
        first = lens_l[0]
        if first and lens_l.count(first) == n:  # all one length (e.g. UNIQ_KEYs): no per-key work at all
            return _finish_array(prefixes, first, _rows(codes.reshape(n, first), first))
        lens = np.array(lens_l, dtype=np.int64)
    else:
        enc = [k.encode("utf-16-be", "surrogatepass") for k in keys]
        codes = np.frombuffer(b"".join(enc), dtype=">u2")
        lens = np.fromiter(map(len, enc), dtype=np.int64, count=n) // 2
    if (lens == 0).any():
        raise ValueError("key_hashes takes non-empty keys only")
    groups = np.unique(lens)
    if len(groups) > _MAX_LENGTH_GROUPS:
        return _finish_array(prefixes, lens, _ragged(codes, lens))
    starts = np.cumsum(lens) - lens
    h = np.empty(n, dtype=np.uint32)
    for length in groups.tolist():
        at = np.flatnonzero(lens == length)
        h[at] = _rows(codes[starts[at, None] + np.arange(length)], length)
    return _finish_array(prefixes, lens, h)
