"""Long polling: a held pull is answered as soon as a matching message arrives, else at its timeout."""
from __future__ import annotations

import threading
import time

import pytest

from broker_support import bodies
from sluice.protocol.codes import ResponseCode

R = ResponseCode


def _pull_in_thread(rpc, *args, **kwargs):
    out: dict = {}

    def run() -> None:
        try:
            out["resp"] = rpc.pull(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the test looks at it (a closed connection's pulls)
            out["error"] = e
        out["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _wait_held(broker, n: int = 1, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while broker.broker.hold.held_count < n:
        assert time.monotonic() < deadline, "pull was not held"
        time.sleep(0.005)


def test_held_pull_woken_by_send(broker):
    consumer, producer = broker.rpc(), broker.rpc()
    producer.send("LP", b"first")
    t, out = _pull_in_thread(consumer, "LP", offset=1, suspend_ms=10_000)
    _wait_held(broker)
    sent = time.monotonic()
    assert producer.send("LP", b"second").code == R.SUCCESS
    t.join(10)
    assert out["resp"].code == R.SUCCESS and bodies(out["resp"]) == [b"second"]
    assert out["at"] - sent < 0.1, f"answered {out['at'] - sent:.3f} s after the send"


def test_held_pull_times_out_with_not_found(broker):
    rpc = broker.rpc()
    assert rpc.send("Quiet", b"x").code == R.SUCCESS
    assert rpc.pull("Quiet", offset=0, suspend_ms=400).code == R.SUCCESS  # a message there: no hold
    t0 = time.monotonic()
    resp = rpc.pull("Quiet", offset=1, suspend_ms=400)
    waited = time.monotonic() - t0
    assert resp.code == R.PULL_NOT_FOUND
    assert 0.35 <= waited < 2.0


def test_non_matching_message_does_not_wake(broker):
    consumer, producer = broker.rpc(), broker.rpc()
    producer.send("LPT", b"a", tags="TagA")
    t, out = _pull_in_thread(consumer, "LPT", offset=1, sub="TagA", suspend_ms=600)
    _wait_held(broker)
    t0 = time.monotonic()
    producer.send("LPT", b"b", tags="TagB")
    t.join(10)
    # Held until its timeout, then pulled once more: the TagB message is skipped.
    assert time.monotonic() - t0 > 0.3
    assert out["resp"].code == R.PULL_RETRY_IMMEDIATELY
    assert out["resp"].ext_fields["nextBeginOffset"] == "2"


def test_held_pull_on_new_queue_woken(broker):
    consumer, producer = broker.rpc(), broker.rpc()
    producer.send("LPN", b"q0", queue_id=0)
    t, out = _pull_in_thread(consumer, "LPN", queue_id=1, offset=0, suspend_ms=10_000)
    _wait_held(broker)
    producer.send("LPN", b"q1", queue_id=1)
    t.join(10)
    assert bodies(out["resp"]) == [b"q1"]


def test_no_suspend_flag_answers_at_once(broker):
    rpc = broker.rpc()
    rpc.send("NS", b"x")
    t0 = time.monotonic()
    resp = rpc.pull("NS", offset=1, sys_flag=0x4, suspend_ms=5000)
    assert resp.code == R.PULL_NOT_FOUND and time.monotonic() - t0 < 1.0


def test_periodic_check_wakes(make_broker):
    b = make_broker(long_polling_check_ms=100)
    rpc = b.rpc()
    rpc.send("PC", b"x")
    hold = b.broker.hold
    # Detach the arrival hook: only the periodic re-check can wake the pull now.
    hold.dispatch = lambda requests: None  # type: ignore[method-assign]
    b.broker.store.dispatch.dispatchers = []
    t, out = _pull_in_thread(rpc, "PC", offset=1, suspend_ms=10_000)
    _wait_held(b)
    rpc2 = b.rpc()
    rpc2.send("PC", b"y")
    t.join(10)
    assert bodies(out["resp"]) == [b"y"]
    assert hold.woken_by_check >= 1


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_held_pulls_are_bounded_per_connection_and_in_all(make_broker):
    b = make_broker(max_held_pulls_per_connection=2, max_held_pulls=3)
    hold = b.broker.hold
    first, second, producer = b.rpc(), b.rpc(), b.rpc()
    producer.send("Lim", b"0")
    held = [_pull_in_thread(first, "Lim", offset=1, suspend_ms=30_000) for _ in range(2)]
    _wait_held(b, 2)
    # the connection's third pull is not held: PULL_NOT_FOUND at once, while its two others still wait
    over = first.pull("Lim", offset=1, suspend_ms=30_000)
    assert over.code == R.PULL_NOT_FOUND and over.ext_fields["nextBeginOffset"] == "1"
    assert hold.held_count == 2 and all(t.is_alive() for t, _ in held)
    held.append(_pull_in_thread(second, "Lim", offset=1, suspend_ms=30_000))
    _wait_held(b, 3)
    # the broker holds max_held_pulls: another connection's pull is answered at once too
    assert second.pull("Lim", offset=1, suspend_ms=30_000).code == R.PULL_NOT_FOUND
    assert hold.refused_full == 2 and hold.held_count == 3
    assert b.broker.runtime_info()["pullNotHeldOverLimit"] == 2
    # a normal client is served meanwhile
    assert producer.pull("Lim", offset=0).code == R.SUCCESS
    # and a message wakes every held pull
    assert producer.send("Lim", b"1").code == R.SUCCESS
    for t, out in held:
        t.join(10)
        assert out["resp"].code == R.SUCCESS and bodies(out["resp"]) == [b"1"]
    _wait(lambda: hold.held_count == 0, "held pulls not released")
    # under the limits again: held once more
    t, out = _pull_in_thread(first, "Lim", offset=2, suspend_ms=30_000)
    _wait_held(b, 1)
    producer.send("Lim", b"2")
    t.join(10)
    assert bodies(out["resp"]) == [b"2"]


def test_held_pulls_of_a_closed_connection_are_dropped(make_broker):
    b = make_broker()
    hold = b.broker.hold
    consumer, producer = b.rpc(), b.rpc()
    producer.send("Gone", b"0")
    threads = [_pull_in_thread(consumer, "Gone", offset=1, suspend_ms=30_000) for _ in range(5)]
    _wait_held(b, 5)
    consumer.close()
    _wait(lambda: hold.held_count == 0, "the closed connection's pulls are still held")
    assert not hold._held and not hold._per_owner
    for t, out in threads:
        t.join(10)
        assert "closed" in str(out["error"])
    assert producer.pull("Gone", offset=0).code == R.SUCCESS


@pytest.mark.parametrize("on_loop", [True, False])
def test_a_pull_that_matches_nothing_to_the_queue_end_is_held_there(make_broker, on_loop: bool):
    """RocketMQ answers PULL_RETRY_IMMEDIATELY, and the client's next pull, from the end, is held: here the
    first pull is held at the end itself, and answered by the arrival that matches, past the ones that do not
    (reading on the loop, the default, or on the pool)."""
    broker = make_broker(pull_on_event_loop=on_loop)
    consumer, producer = broker.rpc(), broker.rpc()
    for i in range(3):
        producer.send("LPE", b"b%d" % i, tags="TagB")
    t, out = _pull_in_thread(consumer, "LPE", offset=0, sub="TagA", suspend_ms=10_000)
    _wait_held(broker)
    assert broker.broker.pull_processor.held_after_no_match == 1
    producer.send("LPE", b"b3", tags="TagB")  # rules out on arrival: still held
    time.sleep(0.1)
    assert "resp" not in out
    sent = time.monotonic()
    producer.send("LPE", b"a4", tags="TagA")
    t.join(10)
    assert out["resp"].code == R.SUCCESS and bodies(out["resp"]) == [b"a4"]
    assert out["resp"].ext_fields["nextBeginOffset"] == "5"
    assert out["at"] - sent < 0.1, f"answered {out['at'] - sent:.3f} s after the send"


@pytest.mark.parametrize("on_loop", [True, False])
def test_a_pull_held_after_matching_nothing_times_out_past_what_it_read(make_broker, on_loop: bool):
    broker = make_broker(pull_on_event_loop=on_loop)
    rpc = broker.rpc()
    for i in range(3):
        rpc.send("LPF", b"b%d" % i, tags="TagB")
    t0 = time.monotonic()
    resp = rpc.pull("LPF", offset=0, sub="TagA", suspend_ms=400)
    assert 0.35 <= time.monotonic() - t0 < 2.0
    assert resp.code == R.PULL_NOT_FOUND and resp.ext_fields["nextBeginOffset"] == "3"


def test_a_pull_that_matches_nothing_is_answered_at_once_without_the_suspend_flag(broker):
    rpc = broker.rpc()
    for i in range(3):
        rpc.send("LPG", b"b%d" % i, tags="TagB")
    resp = rpc.pull("LPG", offset=0, sub="TagA", sys_flag=0x4)  # no SUSPEND flag: RocketMQ's answer
    assert resp.code == R.PULL_RETRY_IMMEDIATELY and resp.ext_fields["nextBeginOffset"] == "3"
    assert broker.broker.pull_processor.held_after_no_match == 0
