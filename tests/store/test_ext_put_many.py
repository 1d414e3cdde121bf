"""ConsumeQueueExt.put_many (dispatch's batch write) is byte-for-byte what put() one by one writes."""
from __future__ import annotations

import random

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidParameterError
from sluice.store.consumequeue_ext import ConsumeQueueExt


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
