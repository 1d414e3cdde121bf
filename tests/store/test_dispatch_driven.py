"""DispatchService.drive_externally: the appender dispatches itself; the thread is only a safety net."""
from __future__ import annotations

import time

from store_testlib import msg, small_config

from sluice.store import MessageStore


def test_appends_do_not_wake_the_thread_and_the_owner_dispatches(tmp_path) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        s.dispatch.drive_externally(poll_s=30.0)  # the thread would not look again within this test
        time.sleep(0.3)  # let the thread go back to its (now long) wait
        s.put_messages([msg(body=b"%d" % i) for i in range(5)])
        assert not s.commitlog.appended.is_set()
        assert s.get_max_offset("T", 0) == 0  # nothing dispatched yet: readers do not see it
        assert s.dispatch.reput() == 5
        assert s.get_max_offset("T", 0) == 5
        assert s.get_messages("T", 0, 0, 10).message_count == 5
    finally:
        s.close()


def test_the_thread_still_dispatches_appends_made_elsewhere(tmp_path) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        s.dispatch.drive_externally(poll_s=0.05)
        s.put_messages([msg(body=b"x")])
        assert s.wait_dispatched(timeout=5.0)  # picked up by the thread's poll
        assert s.get_max_offset("T", 0) == 1
    finally:
        s.close()


def _keyed(n: int, start: int = 0) -> list:
    return [msg(body=b"%d" % i, KEYS=f"k{i}") for i in range(start, start + n)]


def test_index_later_leaves_only_the_key_index_and_a_key_query_builds_it_first(tmp_path) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        s.dispatch.drive_externally(poll_s=30.0)
        time.sleep(0.3)
        s.put_messages(_keyed(3))
        before = s.index.max_indexed_offset()
        assert s.dispatch.reput(index_later=True) == 3
        # Readers of the queue see the messages at once; the key index does not have them yet.
        assert s.get_max_offset("T", 0) == 3
        assert s.get_messages("T", 0, 0, 10).message_count == 3
        assert s.index.max_indexed_offset() == before
        # A key query builds the deferred entries first: it never misses a dispatched message.
        assert [m.body for m in s.query_messages_by_key("T", "k1")] == [b"1"]
        assert s.index.max_indexed_offset() > before
        assert not s.dispatch._index_later
    finally:
        s.close()


def test_deferred_index_entries_keep_dispatch_order_across_reputs(tmp_path) -> None:
    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        s.dispatch.drive_externally(poll_s=30.0)
        time.sleep(0.3)
        s.put_messages(_keyed(2))
        s.dispatch.reput(index_later=True)
        s.put_messages(_keyed(2, start=2))
        s.dispatch.reput(index_later=True)
        # Each reput builds what an earlier one left before it dispatches more: index order is dispatch order.
        assert [r.keys for r in s.dispatch._index_later] == [["k2", "k3"]]
        assert list(s.index.query_offsets("T", "k0", 4, 0, 1 << 62)) and \
            not list(s.index.query_offsets("T", "k2", 4, 0, 1 << 62))
        s.put_messages(_keyed(1, start=4))
        assert s.dispatch.reput() == 1  # builds the deferred ones first, then its own
        assert not s.dispatch._index_later
        for i in range(5):
            assert [m.body for m in s.query_messages_by_key("T", f"k{i}")] == [b"%d" % i]
    finally:
        s.close()


def test_deferred_index_entries_survive_a_failed_build_and_a_close(tmp_path, monkeypatch) -> None:
    from sluice.store import dispatch as dispatch_mod

    s = MessageStore(tmp_path / "s", small_config())
    s.start()
    try:
        s.dispatch.drive_externally(poll_s=30.0)
        time.sleep(0.3)
        s.put_messages(_keyed(2))
        s.dispatch.reput(index_later=True)
        real = dispatch_mod.index_runs

        def failing(index, runs) -> None:  # noqa: ANN001
            raise OSError("index file unavailable")

        monkeypatch.setattr(dispatch_mod, "index_runs", failing)
        try:
            s.dispatch.index_deferred()
        except OSError:
            pass
        else:
            raise AssertionError("the failure must reach the caller")
        assert len(s.dispatch._index_later) == 1  # kept for the retry
        monkeypatch.setattr(dispatch_mod, "index_runs", real)
    finally:
        s.close()  # its final reput builds them
    s2 = MessageStore(tmp_path / "s", small_config())
    s2.start()
    try:
        assert [m.body for m in s2.query_messages_by_key("T", "k0")] == [b"0"]
        assert [m.body for m in s2.query_messages_by_key("T", "k1")] == [b"1"]
    finally:
        s2.close()
