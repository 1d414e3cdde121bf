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
