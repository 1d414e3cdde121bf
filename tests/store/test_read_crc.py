"""A pull refuses a record whose body changed, wherever the change falls in it (bodies of 1 byte to 5,000),
through C (speedups.gather_units, speedups.scan_records: prefetching ahead) and through the Python loop alike."""
from __future__ import annotations

from dataclasses import asdict

import pytest
from store_testlib import msg, small_config

from sluice.broker.filtering import SelectorFilter
from sluice.errors import CorruptRecordError
from sluice.filter import compile_selector
from sluice.format import C_FORMAT
from sluice.speedups import C
from sluice.store import MessageStore, pull_read

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

HEAD_V4 = C_FORMAT["HEAD_V4"]


@pytest.fixture
def store(tmp_path):
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    yield s
    s.close()


def pulls(store: MessageStore, monkeypatch, offset: int) -> list[dict]:
    """The pull at ``offset`` unfiltered and with a SQL92 filter, each through C and through the Python loop."""
    out = []
    for use_c in (True, False):
        with monkeypatch.context() as m:
            if not use_c:
                m.setattr(pull_read, "C", None)
            for mf in (None, SelectorFilter(compile_selector("SQL92", "region = 'eu'"))):
                try:
                    out.append(asdict(store.get_messages("T", 0, offset, 32, mf.for_pull() if mf else None)))
                except CorruptRecordError as e:
                    out.append({"error": str(e).split(" (")[0]})
    return out


@pytest.mark.parametrize("size", [1, 15, 16, 63, 64, 65, 200, 1024, 1100, 5000])
def test_a_changed_body_byte_is_refused_everywhere(store, monkeypatch, size: int) -> None:
    put = store.put_messages([msg(body=bytes(range(256)) * (size // 256) + bytes(size % 256), region="eu")])[0]
    store.wait_dispatched()
    qoff = put.queue_offset
    whole = pulls(store, monkeypatch, qoff)
    assert all(o.get("queue_offsets") == [qoff] for o in whole)
    f = store.commitlog.queue.find(put.commitlog_offset)
    for pos in sorted({0, size // 2, max(0, size - 16), size - 1}):
        at = put.commitlog_offset - f.start + HEAD_V4 + pos
        f.mm[at] ^= 0x5A
        try:
            got = pulls(store, monkeypatch, qoff)
        finally:
            f.mm[at] ^= 0x5A
        assert all("CRC" in o.get("error", "") for o in got), (pos, got)
    assert pulls(store, monkeypatch, qoff) == whole
