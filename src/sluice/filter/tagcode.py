"""Tag codes: what the consume queue keeps for a message's tag.

RocketMQ stores Java's ``String.hashCode()`` of the tag and leaves hash
collisions to the client. Sluice's 8-byte code keeps the Java hash in the low
32 bits and an independent 31-bit hash (CRC32 of the UTF-8 tag) in the high
bits, so the broker can match tags exactly on consume-queue units alone. The
code is never negative, so it cannot be mistaken for a ConsumeQueueExt
address (those are below ``Long.MIN_VALUE + 2**31`` as in RocketMQ).
"""
from __future__ import annotations

import zlib
from functools import lru_cache


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def tag_code(tag: str | None) -> int:
    """The consume-queue tag code of a tag; 0 for no tag."""
    if not tag:
        return 0
    second = zlib.crc32(tag.encode("utf-8")) & 0x7FFFFFFF
    return (second << 32) | (java_string_hash(tag) & 0xFFFFFFFF)


def java_hash_of_code(code: int) -> int:
    """The Java hash part of a tag code, signed, as RocketMQ clients compute it."""
    low = code & 0xFFFFFFFF
    return low - 0x100000000 if low & 0x80000000 else low
