"""Long polling: a held pull is answered as soon as a matching message arrives, else at its timeout."""
from __future__ import annotations

import threading
import time

from broker_support import bodies
from sluice.protocol.codes import ResponseCode

R = ResponseCode


def _pull_in_thread(rpc, *args, **kwargs):
    out: dict = {}

    def run() -> None:
        out["resp"] = rpc.pull(*args, **kwargs)
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
