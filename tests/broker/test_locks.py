from __future__ import annotations

from sluice.broker.locks import RebalanceLockManager

Q0, Q1 = ("T", "b", 0), ("T", "b", 1)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_one_owner_until_expiry():
    clock = Clock()
    lm = RebalanceLockManager(60_000, clock)
    assert lm.try_lock_batch("g", [Q0, Q1], "c1") == {Q0, Q1}
    assert lm.try_lock_batch("g", [Q0, Q1], "c2") == set()
    clock.t += 30
    assert lm.try_lock_batch("g", [Q0], "c1") == {Q0}  # renew Q0 only
    clock.t += 40  # Q1 last renewed 70 s ago, Q0 40 s ago
    assert lm.try_lock_batch("g", [Q0, Q1], "c2") == {Q1}
    assert lm.owner("g", Q0) == "c1" and lm.owner("g", Q1) == "c2"


def test_groups_are_independent_and_unlock_only_own():
    lm = RebalanceLockManager()
    assert lm.try_lock_batch("g1", [Q0], "c1") == {Q0}
    assert lm.try_lock_batch("g2", [Q0], "c2") == {Q0}
    lm.unlock_batch("g1", [Q0], "c2")
    assert lm.is_locked_by("g1", Q0, "c1")
    lm.unlock_batch("g1", [Q0], "c1")
    assert lm.owner("g1", Q0) is None


def test_release_client():
    lm = RebalanceLockManager()
    lm.try_lock_batch("g", [Q0, Q1], "c1")
    lm.release_client("c1")
    assert lm.try_lock_batch("g", [Q0, Q1], "c2") == {Q0, Q1}
