"""ConsumeQueueExt.put_many (dispatch's batch write) is byte-for-byte what put() one by one writes."""
from __future__ import annotations

import random

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidParameterError
import sluice.store.consumequeue_ext as CQE
from sluice.store.consumequeue_ext import ConsumeQueueExt, decorate


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 1000), batches=st.lists(st.integers(1, 60), min_size=1, max_size=6),
       blen=st.sampled_from([0, 3, 14]))
def test_put_many_equals_put(tmp_path_factory, seed, batches, blen):
    root = tmp_path_factory.mktemp("ext")
    rng = random.Random(seed)
    one, many = (ConsumeQueueExt(root / d, file_size=512, bitmap_bytes_max=16) for d in ("one", "many"))
    try:
        for n in batches:
            tags = [rng.randrange(1 << 40) for _ in range(n)]
            times = [rng.randrange(1 << 41) for _ in range(n)]
            bits = [bytes(rng.randrange(256) for _ in range(blen)) for _ in range(n)]
            a = [one.put(t, s, b) for t, s, b in zip(tags, times, bits)]
            assert many.put_many(tags, times, bits) == a
            got = many.get_many(np.array(a, dtype=np.int64))
            assert got.valid.all() and got.tags_codes.tolist() == tags
        one.flush()
        many.flush()
        for f1, f2 in zip(sorted((root / "one").iterdir()), sorted((root / "many").iterdir()), strict=True):
            assert f1.name == f2.name and f1.read_bytes() == f2.read_bytes()
        reloaded = ConsumeQueueExt(root / "many", file_size=512, bitmap_bytes_max=16)
        reloaded.load()
        assert reloaded.max_address() == many.max_address()
        reloaded.close()
    finally:
        one.close()
        many.close()


def test_a_small_batch_with_one_bad_unit_writes_nothing(tmp_path):
    """Few units go one by one (as put() writes them), yet all are checked first, as the vectorised write does."""
    e = ConsumeQueueExt(tmp_path, file_size=512, bitmap_bytes_max=4)
    first = e.put(1, 1, b"ab")
    for bad in ([(2, 2, b"ok"), (3, 3, b"12345")], [(2, 2, b"ok"), (1 << 63, 3, b"")]):
        with pytest.raises(InvalidParameterError):
            e.put_many(*map(list, zip(*bad)))
        assert e.max_address() == first + 22  # only the first unit is stored
    assert e.put_many([4, 5], [4, 5], [b"", b"xyz"]) == [first + 22, first + 42]
    e.close()


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 40), blen=st.integers(0, 20))
def test_the_c_pack_equals_the_numpy_pack(data, n, blen):
    """speedups.ext_pack packs put_many's units byte for byte as the numpy twin; a value outside int64 it
    leaves to the twin (None), which refuses it with OverflowError (put_many's InvalidParameterError)."""
    if CQE.C is None:
        pytest.skip("the C extension is not built")
    big = st.integers(-(1 << 63), (1 << 63) - 1)
    tags = data.draw(st.lists(big, min_size=n, max_size=n))
    times = data.draw(st.lists(big, min_size=n, max_size=n))
    bits = data.draw(st.lists(st.binary(min_size=blen, max_size=blen), min_size=n, max_size=n))
    assert CQE.C.ext_pack(tags, times, bits) == CQE._pack_units(tags, times, bits, blen)
    bad = list(tags)
    bad[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from([1 << 63, -(1 << 63) - 1]))
    assert CQE.C.ext_pack(bad, times, bits) is None and CQE.C.ext_pack(tags, bad, bits) is None
    with pytest.raises(OverflowError):
        CQE._pack_units(bad, times, bits, blen)


def test_the_c_pack_leaves_unusual_input_to_the_twin(tmp_path):
    if CQE.C is None:
        pytest.skip("the C extension is not built")
    assert CQE.C.ext_pack([1, 2], [3, 4], [b"a", b"bc"]) is None
    assert CQE.C.ext_pack([1, 2], [3, 4], [b"a", bytearray(b"b")]) is None
    assert CQE.C.ext_pack([1], [3, 4], [b"a", b"b"]) is None
    assert CQE.C.ext_pack([1, 2.0], [3, 4], [b"a", b"b"]) is None
    assert CQE.C.ext_pack([1, 2], [3, 4], [b"a", b"b"]) is not None
    many, one = (ConsumeQueueExt(tmp_path / d, file_size=4096, bitmap_bytes_max=8) for d in ("many", "one"))
    tags, times, bits = list(range(40)), list(range(40)), [bytes(i % 3) for i in range(40)]
    assert many.put_many(tags, times, bits) == [one.put(t, s, b) for t, s, b in zip(tags, times, bits)]
    got = many.get_many(np.array([decorate(0)], dtype=np.int64))
    assert got.valid.all() and got.bitmap_lengths.tolist() == [0]
    many.close()
    one.close()


@pytest.mark.parametrize("with_c", [True, False])
def test_put_many_with_and_without_c_stores_the_same(tmp_path, with_c, monkeypatch):
    if not with_c:
        monkeypatch.setattr(CQE, "C", None)
    e = ConsumeQueueExt(tmp_path, file_size=1024, bitmap_bytes_max=8)
    tags, times, bits = list(range(100, 150)), list(range(7, 57)), [bytes([i, i + 1]) for i in range(50)]
    addrs = e.put_many(tags, times, bits)
    got = e.get_many(np.array(addrs, dtype=np.int64))
    assert got.valid.all() and got.tags_codes.tolist() == tags and got.msg_store_times.tolist() == times
    assert [bytes(r[:2]) for r in got.bitmaps] == bits
    with pytest.raises(InvalidParameterError, match="out of range"):
        e.put_many([1 << 63] * 40, list(range(40)), [b"ab"] * 40)
    assert e.max_address() == addrs[-1] + 22  # the refused batch wrote nothing
    e.close()
