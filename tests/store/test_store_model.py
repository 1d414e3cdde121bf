"""A state-machine test: random puts, clean restarts, crashes with torn tails, retention and pulls,
checked against a plain model of what each queue holds."""
from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from store_testlib import simulate_crash, small_config

from sluice.protocol.record import iter_records
from sluice.store import GetMessageStatus as S
from sluice.store import MessageStore, StoreMessage

CFG = small_config(commitlog_file_size=128 * 1024, consumequeue_units_per_file=16, max_message_size=8 * 1024,
                   checkpoint_interval_ms=3_600_000, retention_hours=1.0)
QUEUES = [("A", 0), ("A", 1), ("B", 0)]


class StoreModel(RuleBasedStateMachine):
    @initialize()
    def open_store(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-model-"))
        self.store = MessageStore(self.dir, CFG).start()
        self.model: dict[tuple[str, int], list[tuple[int, bytes]]] = {q: [] for q in QUEUES}  # (phys, body)
        self.min_phys = 0
        self.n = 0

    def teardown(self) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(q=st.sampled_from(QUEUES), sizes=st.lists(st.integers(1, 6000), min_size=1, max_size=5))
    def put(self, q, sizes) -> None:
        batch = []
        for size in sizes:
            self.n += 1
            batch.append(StoreMessage(q[0], (b"%d|" % self.n) * (size // 4 + 1), q[1], {"KEYS": f"k{self.n}"}))
        res = self.store.put_messages(batch)
        expect = len(self.model[q])
        assert [r.queue_offset for r in res] == list(range(expect, expect + len(batch)))
        self.model[q] += [(r.commitlog_offset, m.body) for r, m in zip(res, batch)]

    @rule()
    def clean_restart(self) -> None:
        self.store.close()
        self.store = MessageStore(self.dir, CFG).start()
        assert not self.store.recovery_report.abnormal

    @rule(garbage=st.binary(min_size=1, max_size=300))
    def crash_with_torn_tail(self, garbage) -> None:
        self.store.flusher.flush()  # everything acknowledged is durable (as with sync flush)
        end = self.store.commitlog.write_pos
        simulate_crash(self.store)
        segs = sorted((self.dir / "commitlog").iterdir()) if (self.dir / "commitlog").is_dir() else []
        seg = segs[-1] if segs else None
        start = int(seg.name) if seg else 0
        if seg and start <= end < start + CFG.commitlog_file_size - len(garbage) - 8:
            with open(seg, "r+b") as f:  # a put that was cut short: a plausible header and junk
                f.seek(end - start)
                f.write(struct.pack(">iI", 200 + len(garbage), 0xDAA320A7) + garbage)
        self.store = MessageStore(self.dir, CFG).start()
        assert self.store.recovery_report.abnormal and self.store.commitlog.write_pos == end

    @precondition(lambda self: self.n > 0)
    @rule()
    def retention(self) -> None:
        self.store.wait_dispatched()
        self.store.flusher.flush()
        newest = max(self.store.commitlog.last_store_timestamp, 1)
        self.store.delete_expired_files(now=newest / 1000 + 2 * 3600)
        self.min_phys = self.store.commitlog.min_offset

    @rule(q=st.sampled_from(QUEUES), data=st.data())
    def pull(self, q, data) -> None:
        assert self.store.wait_dispatched()
        items = self.model[q]
        lo = self.store.get_min_offset(*q)
        assert lo == next((i for i, (p, _) in enumerate(items) if p >= self.min_phys), len(items))
        if lo == len(items):
            return
        start = data.draw(st.integers(lo, len(items) - 1))
        got = self.store.get_messages(q[0], q[1], start, 8, max_bytes=1 << 20)
        assert got.status is S.FOUND
        bodies = [r.body for r in iter_records(got.data)]
        assert bodies == [b for _, b in items[start:start + len(bodies)]] and len(bodies) == min(8, len(items) - start)

    @invariant()
    def offsets_agree(self) -> None:
        if getattr(self, "store", None) is None:
            return
        assert self.store.wait_dispatched()
        for q in QUEUES:
            assert self.store.get_max_offset(*q) == len(self.model[q])


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=15, stateful_step_count=25, deadline=None)
