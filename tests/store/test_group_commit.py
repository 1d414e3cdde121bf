"""Synchronous puts from many threads (store/group_commit.py): one writer appends and fsyncs for all."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from store_testlib import msg, small_config

from sluice.errors import MessageIllegalError
from sluice.protocol.record import decode_record
from sluice.store import MessageStore


def test_many_writers_each_get_their_own_durable_results(tmp_path: Path) -> None:
    s = MessageStore(tmp_path / "s", small_config(flush_mode="sync")).start()
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            out = []
            for i in range(40):
                batch = [msg(topic=f"T{w % 3}", body=f"{w}:{i}:{j}".encode(), qid=w % 2, KEYS=f"k{w}-{i}-{j}")
                         for j in range(1 + i % 3)]
                res = s.put_messages(batch)
                assert s.flusher.flushed_offset >= res[-1].commitlog_offset + res[-1].size  # durable on return
                out.append((batch, res))
            got[w] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and len(got) == 16
        seen: set[tuple[str, int, int]] = set()
        for out in got.values():
            for batch, res in out:
                assert len(res) == len(batch)
                offsets = [r.queue_offset for r in res]
                assert offsets == list(range(offsets[0], offsets[0] + len(res)))  # a put stays contiguous
                for m, r in zip(batch, res):
                    rec = decode_record(s.read_record(r.commitlog_offset))
                    assert (rec.topic, rec.queue_id, rec.queue_offset, rec.body) == \
                        (m.topic, m.queue_id, r.queue_offset, m.body)
                    seen.add((m.topic, m.queue_id, r.queue_offset))
        assert len(seen) == sum(len(b) for out in got.values() for b, _ in out)  # no offset given twice
        assert s.group_commit.rounds < sum(len(out) for out in got.values())  # puts shared rounds
    finally:
        s.close()


def test_an_invalid_put_fails_alone(tmp_path: Path) -> None:
    s = MessageStore(tmp_path / "s", small_config(flush_mode="sync", max_message_size=1024)).start()
    outcomes: dict[int, object] = {}
    start = threading.Barrier(8)

    def writer(w: int) -> None:
        start.wait()
        body = b"x" * (4096 if w == 3 else 10)  # writer 3's message is over the limit
        try:
            outcomes[w] = s.put_messages([msg(body=body, KEYS=f"w{w}")])
        except MessageIllegalError as e:
            outcomes[w] = e

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert isinstance(outcomes[3], MessageIllegalError) and "limit" in str(outcomes[3])
        good = [outcomes[w] for w in range(8) if w != 3]
        assert all(isinstance(o, list) and len(o) == 1 for o in good)
        assert sorted(o[0].queue_offset for o in good) == list(range(7))  # nothing half-written
    finally:
        s.close()


def test_a_lone_writer_leads_itself(tmp_path: Path) -> None:
    with MessageStore(tmp_path / "s", small_config(flush_mode="sync")) as s:
        fsyncs = s.flusher.fsyncs
        [r] = s.put_messages([msg(body=b"one")])
        assert r.queue_offset == 0 and s.flusher.fsyncs == fsyncs + 1
        with pytest.raises(MessageIllegalError):
            s.put_messages([msg(topic="bad topic")])
        assert s.put_messages([msg(body=b"two")])[0].queue_offset == 1  # the lead was given back
