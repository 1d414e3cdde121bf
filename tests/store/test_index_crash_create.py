"""A process killed while it creates an index file leaves a store that loads.

CI once restarted a broker killed with SIGKILL (tests/client/test_transaction_producer.py) and the
restart refused its store: the new index file had been allocated (posix_fallocate, which also
extends the file) but not yet sized, and load() took the short file for one of another
configuration. Here a child process creates an index file and dies (os._exit) right after each
step of the creation; the parent then loads the directory as a restarted broker would.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sluice.store.index import ENTRY, ENTRY_ALLOC_CHUNK, HEADER, IndexService

SLOTS = 512
# Entries beyond one allocation chunk: the file is then larger than what creation allocates at once.
NUM = 2 * ENTRY_ALLOC_CHUNK // ENTRY.size
FULL = HEADER.size + SLOTS * 4 + NUM * ENTRY.size

CHILD = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import sluice.store.index as ix

    step = sys.argv[2]

    def then_die(f):
        def wrapped(*a, **k):
            f(*a, **k)
            os._exit(9)
        return wrapped

    if step == "sized":
        os.ftruncate = then_die(os.ftruncate)
    elif step == "allocated":
        ix.allocate = then_die(ix.allocate)
    elif step == "headed":
        ix.IndexFile._write_header = then_die(ix.IndexFile._write_header)
    s = ix.IndexService(Path(sys.argv[1]), max_hash_slots=int(sys.argv[3]), max_index_num=int(sys.argv[4]))
    s.load()
    s.build_index("T", "first", [], 0, 1_700_000_000_000)
    sys.exit(3)  # the step never ran
""")


def _crash_while_creating(d: Path, step: str) -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, str(d), step, str(SLOTS), str(NUM)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 9, r.stderr[-2000:]


def _loads_and_indexes(d: Path) -> list[Path]:
    """Load ``d`` as a restart does; the remnant is gone or kept, and the service indexes and finds a key."""
    s = IndexService(d, max_hash_slots=SLOTS, max_index_num=NUM)
    s.load()
    try:
        left = [f.path for f in s.files]
        s.build_index("T", "after", [], 4096, 1_700_000_000_000)
        assert s.query_offsets("T", "after", 10, 0, 1 << 62) == [4096]
        assert s.query_offsets("T", "first", 10, 0, 1 << 62) == []  # never indexed: the crash came first
        return left
    finally:
        s.close()


@pytest.mark.parametrize("step", ["sized", "allocated", "headed"])
def test_a_crash_at_any_step_of_creating_an_index_file_leaves_a_loadable_store(tmp_path: Path, step: str) -> None:
    _crash_while_creating(tmp_path, step)
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 1  # the crash came after the file existed
    assert (tmp_path / names[0]).stat().st_size == FULL  # sized before anything else
    assert _loads_and_indexes(tmp_path) == []  # it held no entry: dropped


def test_a_short_never_written_file_an_older_version_left_is_removed(tmp_path: Path, caplog) -> None:
    """Allocated to its first chunk, not sized, no header: what the allocate-then-size order left behind."""
    p = tmp_path / "20261129114721123"
    with open(p, "wb") as fh:
        fh.truncate(HEADER.size + SLOTS * 4 + ENTRY_ALLOC_CHUNK)
    (tmp_path / "20261129114721124").touch()  # the empty file of a crash before either step
    with caplog.at_level(logging.WARNING, logger="sluice.store.index"):
        assert _loads_and_indexes(tmp_path) == []
    assert not p.exists() and not (tmp_path / "20261129114721124").exists()
    assert sum("left unfinished by a crash" in r.getMessage() for r in caplog.records) == 2


def test_a_short_file_with_a_header_is_still_refused(tmp_path: Path) -> None:
    """A file of a smaller configuration holds entries: never removed, the configuration error stands."""
    small = IndexService(tmp_path, max_hash_slots=SLOTS, max_index_num=8)
    small.load()
    small.build_index("T", "kept", [], 0, 1_700_000_000_000)
    small.close()
    (p,) = tmp_path.iterdir()
    before = p.read_bytes()
    with pytest.raises(Exception, match="configured differently"):
        IndexService(tmp_path, max_hash_slots=SLOTS, max_index_num=NUM).load()
    assert p.read_bytes() == before
    assert os.path.getsize(p) < FULL
