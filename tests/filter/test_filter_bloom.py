"""RocketMQ's BloomFilter (filter/src/main/java/org/apache/rocketmq/filter/util/BloomFilter.java): sizing,
test vectors of Guava's murmur3_128 as BloomFilter.java uses it, bit order, batches."""
from __future__ import annotations

import numpy as np
import pytest

from sluice.errors import InvalidParameterError
from sluice.filter import BitsArray, BloomFilter, BloomFilterData
from sluice.filter.bloom import murmur3_as_long


@pytest.mark.parametrize(("f", "n", "k", "m"), [(20, 32, 3, 112), (10, 20, 4, 96), (20, 64, 3, 216),
                                                (1, 300, 7, 2880), (10, 128, 4, 616)])
def test_create_by_fn(f: int, n: int, k: int, m: int) -> None:
    bloom = BloomFilter.create_by_fn(f, n)
    assert (bloom.k, bloom.m) == (k, m)


@pytest.mark.parametrize(("f", "n"), [(0, 10), (100, 10), (20, 0)])
def test_bad_parameters(f: int, n: int) -> None:
    with pytest.raises(InvalidParameterError):
        BloomFilter(f, n)


VECTORS = [
    ("CID_abc_efg", 4702030830789548369, [49, 97, 110], [49, 17, 78, 14]),
    ("CID_0#topic0", 6304720223234318284, [80, 66, 42], [80, 18, 42, 56]),
    ("GroupA#TopicTest", 4654937542781345422, [105, 17, 70], [41, 1, 38, 78]),
    ("", 0, [0, 0, 0], [0, 0, 0, 0]),
]


@pytest.mark.parametrize(("key", "as_long", "pos_20_32", "pos_10_20"), VECTORS)
def test_vectors(key: str, as_long: int, pos_20_32: list[int], pos_10_20: list[int]) -> None:
    assert murmur3_as_long(key) == as_long
    assert list(BloomFilter(20, 32).calc_bit_positions(key)) == pos_20_32
    assert list(BloomFilter(10, 20).calc_bit_positions(key)) == pos_10_20


def test_hash_to_bytes_vector() -> None:
    bloom = BloomFilter(20, 32)
    bits = bloom.empty_bits()
    bloom.hash_to("CID_0#topic0", bits)
    assert bits.bytes().hex() == "0000000000040000040001000000"
    assert bloom.is_hit("CID_0#topic0", bits)
    assert not bloom.is_hit("CID_abc_efg", bits)


def test_bits_array_order() -> None:
    bits = BitsArray(16)
    bits.set_bit(0)
    bits.set_bit(9)
    assert bits.bytes() == bytes([0b00000001, 0b00000010])
    assert bits.get_bit(9) and not bits.get_bit(8)
    bits.set_bit(9, False)
    assert not bits.get_bit(9)
    with pytest.raises(InvalidParameterError):
        bits.get_bit(16)


def test_validity() -> None:
    bloom = BloomFilter(20, 32)
    data = bloom.generate("g#t")
    assert bloom.is_valid(data)
    assert data == BloomFilterData(data.bit_pos, 112)
    assert BloomFilterData.from_json(data.to_json()) == data
    assert not bloom.is_valid(None)
    assert not bloom.is_valid(BloomFilterData(data.bit_pos, 216))
    assert not bloom.is_valid(BloomFilterData(data.bit_pos[:2], 112))
    with pytest.raises(InvalidParameterError):
        bloom.hash_to(BloomFilterData(data.bit_pos, 216), bloom.empty_bits())
    with pytest.raises(InvalidParameterError):
        bloom.is_hit(data, BitsArray(216))
    assert not BloomFilter(20, 64).is_valid(data)


def test_batch_is_hit_matches_scalar() -> None:
    bloom = BloomFilter(20, 32)
    consumers = [bloom.generate(f"group{i}#topic") for i in range(6)]
    rng = np.random.default_rng(1)
    matches = rng.random((500, len(consumers))) < 0.3
    bitmaps = np.zeros((500, bloom.m // 8), dtype=np.uint8)
    for j, data in enumerate(consumers):
        bloom.hash_to_batch(data, bitmaps, matches[:, j])
    for j, data in enumerate(consumers):
        hit = bloom.is_hit_batch(data, bitmaps)
        scalar = [bloom.is_hit(data, BitsArray.from_bytes(row.tobytes())) for row in bitmaps]
        assert hit.tolist() == scalar
        assert hit[matches[:, j]].all()  # no false negatives
    with pytest.raises(InvalidParameterError):
        bloom.is_hit_batch(consumers[0], np.zeros((3, 5), dtype=np.uint8))
