"""Helpers for the store tests (a uniquely named module: several test folders have a conftest.py)."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from sluice.filter.tagcode import tag_code
from sluice.protocol.record import iter_records
from sluice.store import GetMessageStatus, MessageStore, PutResult, StoreConfig, StoreMessage
from sluice.store.types import TagCodeFilter


def run_alone(module: str, function: str, *args: str, timeout: float = 600) -> Any:
    """``module.function(*args)`` (a module of this folder) in a fresh interpreter, its result through JSON.

    For memory peaks taken with tracemalloc, which counts every thread's allocations: threads that earlier
    tests of the suite's process left running moved such a peak by megabytes (22.4 MiB against 18.8 alone,
    once in CI)."""
    here = Path(__file__).resolve().parent
    probe = ("import importlib, sys, orjson; sys.path[:0] = sys.argv[1:3]; "
             "f = getattr(importlib.import_module(sys.argv[3]), sys.argv[4]); "
             "print(orjson.dumps(f(*sys.argv[5:])).decode())")
    out = subprocess.run([sys.executable, "-c", probe, str(here), str(here.parent), module, function, *args],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return orjson.loads(out.stdout.strip().splitlines()[-1])


def small_config(**kw) -> StoreConfig:
    base = dict(commitlog_file_size=1 << 20, consumequeue_units_per_file=64, max_message_size=256 * 1024,
                index_max_hash_slots=512, index_max_index_num=4096, checkpoint_interval_ms=200,
                flush_interval_ms=50, retention_check_interval_s=3600.0)
    base.update(kw)
    return StoreConfig(**base)


def msg(topic: str = "T", body: bytes = b"hello", qid: int = 0, **props: str) -> StoreMessage:
    return StoreMessage(topic, body, qid, dict(props))


def simulate_crash(s: MessageStore) -> None:
    """Stop a store the way a kill would: no final dispatch, flush or checkpoint, abort file left behind."""
    s._open = False
    s._stop.set()
    if s._maint is not None:
        s._maint.join()
    s.dispatch.stop()
    s.flusher.stop()
    s._close_files()
    s._release_lock()


class TagFilter(TagCodeFilter):
    """A store MessageFilter deciding on tag codes alone, as the broker's TAG selectors do."""

    needs_record = False

    def __init__(self, *tags: str) -> None:
        self.codes = np.array([tag_code(t) for t in tags], dtype=np.int64)

    def match_units(self, tag_codes: np.ndarray) -> np.ndarray:
        return np.isin(tag_codes, self.codes)

    def match_record(self, properties: dict[str, str]) -> bool:
        return True


def acked_lines(results: Sequence[PutResult], batch: Sequence[StoreMessage]) -> str:
    """What a crash test's child prints once a put returned (durable), one line per message, as
    :func:`verify_recovered` reads them: ``<commitlog offset> <topic> <queue id> <queue offset> <sha256 of body>
    <KEYS>``."""
    return "".join(f"{r.commitlog_offset} {m.topic} {m.queue_id} {r.queue_offset} "
                   f"{hashlib.sha256(m.body).hexdigest()} {m.properties['KEYS']}\n" for r, m in zip(results, batch))


def verify_recovered(s: MessageStore, acked: list[list[str]]) -> None:
    """After a crash: every acknowledged message (:func:`acked_lines`, split) is there, whole, and found by its
    key; the store's check passes; every queue reads back without a gap."""
    for off, topic, qid, qoff, sha, key in acked:
        m = s.get_message_by_offset(int(off))
        assert m is not None, f"acked message at {off} lost"
        assert (m.topic, m.queue_id, m.queue_offset, m.keys) == (topic, int(qid), int(qoff), [key])
        assert hashlib.sha256(m.body).hexdigest() == sha
    rep = s.check()
    assert rep.ok, rep.problems[:5]
    for topic, qids in s.topic_queues().items():
        for qid in qids:
            lo, hi = s.get_min_offset(topic, qid), s.get_max_offset(topic, qid)
            got = s.get_messages(topic, qid, lo, hi - lo, max_bytes=1 << 30)
            assert got.status is GetMessageStatus.FOUND
            assert [r.queue_offset for r in iter_records(got.data)] == list(range(lo, hi))
    for off, topic, _q, _o, _sha, key in acked[-10:]:
        assert int(off) in [m.commitlog_offset for m in s.query_messages_by_key(topic, key)]
