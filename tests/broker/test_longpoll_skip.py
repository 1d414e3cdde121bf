"""A held pull's ``read_from``: the units that arrive next in order and that its filter rules out at dispatch are
not read again when a wanted unit wakes it (HoldService.hold_then, SelectorFilter.dispatch_verdict); the answer is
the one a read from the pull's own offset gives, with the same filter metrics."""
from __future__ import annotations

import asyncio
import threading
import time

from broker_support import bodies
from sluice.broker.filtering import SelectorFilter
from sluice.broker.longpoll import HELD, TIMED_OUT, HoldService
from sluice.filter import compile_selector
from sluice.protocol.codes import ResponseCode
from sluice.store.dispatch_columns import DispatchBatch
from test_longpoll_batch import _run

R = ResponseCode


class _Owner:
    def on_close(self, cb) -> None:  # noqa: ANN001
        pass


def _service() -> HoldService:
    hold = HoldService(lambda t, q: 0, check_interval_s=3600)
    hold.start()
    return hold


def _held(hold: HoldService, f: SelectorFilter | None, offset: int = 0, timeout: float = 3600
          ) -> tuple[list[int], list[int]]:
    calls: list[int] = []
    read_from = [-5, -5]
    assert hold.hold_then("T", 0, offset, f, timeout, _Owner(), calls.append, read_from=read_from) == HELD
    assert read_from == [offset, -1]
    return calls, read_from


def test_ruled_out_arrivals_move_read_from_and_the_wanted_one_wakes() -> None:
    async def main() -> None:
        hold = _service()
        calls, read_from = _held(hold, SelectorFilter(compile_selector("SQL92", "color = 'red'")), offset=2)
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 2, 0, ["A", "A"], ["blue", "green"])]))
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 4, 200, [None, "A", "A"], ["blue", "red", "blue"])]))
        assert read_from == [5, 5]  # 2, 3, 4 ruled out; 5 wanted, judged (the 6 after it is the read's business)
        await asyncio.sleep(0)
        assert calls == [500]
        await hold.stop()
    asyncio.run(main())


def test_a_gap_or_an_older_unit_stops_read_from() -> None:
    async def main() -> None:
        hold = _service()
        _, read_from = _held(hold, SelectorFilter(compile_selector("SQL92", "color = 'red'")), offset=3)
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 1, 0, ["A", "A"], ["blue", "blue"])]))  # before 3
        assert read_from == [3, -1]
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 4, 0, ["A"], ["blue"])]))  # 3 not seen: a gap
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 5, 0, ["A"], ["red"])]))  # wakes it, unjudged: gap
        assert read_from == [3, -1] and hold.held_count == 0
        await hold.stop()
    asyncio.run(main())


def test_an_evaluation_error_is_left_for_the_pull_to_report() -> None:
    async def main() -> None:
        hold = _service()
        f = SelectorFilter(compile_selector("SQL92", "color > 5"))  # 'blue' is no number: an evaluation error
        assert f.dispatch_verdict(0, {"color": "blue"}) == 2 and f.dispatch_verdict(0, {"color": "3"}) == 0
        assert f.dispatch_verdict(0, {"color": "9"}) == 1 and f.dispatch_verdict(0, {}) == 0  # NULL: FALSE
        _, read_from = _held(hold, f)
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 0, ["A", "A"], ["3", "blue"])]))
        assert read_from == [1, -1]  # 0 ruled out, 1 must be read (its error is the pull's to count)
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 2, 0, ["A"], ["4"])]))
        assert read_from == [1, -1]
        await hold.stop()
    asyncio.run(main())


def test_tag_codes_and_no_filter() -> None:
    async def main() -> None:
        hold = _service()
        tags = SelectorFilter(compile_selector("TAG", "TagB || TagC"))
        _, read_from = _held(hold, tags)
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 0, ["TagA", None, "TagD"], ["x", "x", "x"])]))
        assert read_from == [3, -1] and hold.held_count == 1
        await hold.stop()
        hold = _service()
        calls, read_from = _held(hold, None)  # no filter: every arrival wakes, nothing is skipped
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 0, ["TagA"], ["x"])]))
        await asyncio.sleep(0)
        assert calls == [100] and read_from == [0, -1]
        await hold.stop()
    asyncio.run(main())


def test_a_timed_out_pull_keeps_read_from_but_its_caller_rereads() -> None:
    async def main() -> None:
        hold = _service()
        calls, read_from = _held(hold, SelectorFilter(compile_selector("SQL92", "color = 'red'")), timeout=0.05)
        hold.dispatch_batch(DispatchBatch([_run("T", 0, 0, 0, ["A"], ["blue"])]))
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert calls == [TIMED_OUT] and read_from == [1, -1]
        await hold.stop()
    asyncio.run(main())


def _spy_reads(broker, monkeypatch, topic: str) -> list[tuple[int, int, bool]]:  # noqa: ANN001
    """The store reads of ``topic``'s pulls from now on: (offset, max messages, read with the filter)."""
    store = broker.broker.store
    reads: list[tuple[int, int, bool]] = []
    real_get = store.get_messages

    def get_messages(t, queue_id, offset, max_msgs, mf, *args):  # noqa: ANN001, ANN002, ANN202
        if t == topic:
            reads.append((offset, max_msgs, mf is not None))
        return real_get(t, queue_id, offset, max_msgs, mf, *args)

    monkeypatch.setattr(store, "get_messages", get_messages)
    return reads


def _wait_held(broker) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 5
    while broker.broker.hold.held_count < 1:
        assert time.monotonic() < deadline, "pull was not held"
        time.sleep(0.005)


def _pull_in_thread(rpc, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("resp", rpc.pull(*args, **kwargs)))
    t.start()
    return t, out


def test_woken_pull_answers_as_a_read_from_its_own_offset(broker, monkeypatch) -> None:  # noqa: ANN001
    consumer, producer, reader = broker.rpc(), broker.rpc(), broker.rpc()
    reads = _spy_reads(broker, monkeypatch, "Skip")
    sql = "region = 'eu' AND a > 5"
    producer.send("Skip", b"old", props={"region": "eu", "a": "9"})
    t, out = _pull_in_thread(consumer, "Skip", offset=1, group="G", sub=sql, expr_type="SQL92", suspend_ms=10_000)
    _wait_held(broker)
    for region, a in (("us", "9"), ("eu", "1"), ("cn", "7"), ("eu", "x"), ("us", "6")):
        producer.send("Skip", f"{region}-{a}".encode(), props={"region": region, "a": a})  # offsets 1..5
    assert broker.broker.hold.held_count == 1  # none of them wanted (offset 4's error included)
    producer.send("Skip", b"hit", props={"region": "eu", "a": "8"})  # offset 6
    t.join(10)
    held = out["resp"]
    assert held.code == R.SUCCESS and bodies(held) == [b"hit"]
    # Held after a read from 1; woken, it read from offset 4 with the filter (4 is an error the read reports).
    assert [(o, f) for o, _, f in reads] == [(1, True), (4, True)]
    held_metrics = broker.broker.filter_data.metrics_of("G", "Skip").to_wire()
    plain = reader.pull("Skip", offset=1, group="G2", sub=sql, expr_type="SQL92")
    assert bodies(plain) == bodies(held)
    assert plain.ext_fields["nextBeginOffset"] == held.ext_fields["nextBeginOffset"] == "7"
    # The skipped units count as evaluated, as the plain read's evaluations do; offset 4's error is counted.
    assert broker.broker.filter_data.metrics_of("G2", "Skip").to_wire() == held_metrics
    assert held_metrics["evaluated"] == 6 and held_metrics["errors"] == 1 and held_metrics["matched"] == 1


def test_woken_by_the_last_unit_reads_it_unjudged(broker, monkeypatch) -> None:  # noqa: ANN001
    """The unit that woke the pull is the queue's last and was judged as the read would judge it: the read takes
    that record alone, without the filter; the answer and the metrics are a plain read's."""
    consumer, producer, reader = broker.rpc(), broker.rpc(), broker.rpc()
    for queue in (0, 1):  # the topic and its queues exist, each with one unwanted message
        producer.send("Last", b"old", props={"region": "us"}, tags="TagA", queue_id=queue)
    reads = _spy_reads(broker, monkeypatch, "Last")
    for queue, sub, kind in ((0, "region = 'eu'", "SQL92"), (1, "TagB || TagC", None)):
        reads.clear()
        t, out = _pull_in_thread(consumer, "Last", queue_id=queue, offset=1, group="G", sub=sub, expr_type=kind,
                                 suspend_ms=10_000)
        _wait_held(broker)
        producer.send("Last", b"us", props={"region": "us"}, tags="TagA", queue_id=queue)
        producer.send("Last", b"eu", props={"region": "eu"}, tags="TagC", queue_id=queue)
        t.join(10)
        held = out["resp"]
        assert held.code == R.SUCCESS and bodies(held) == [b"eu"] and held.ext_fields["nextBeginOffset"] == "3"
        assert [(o, f) for o, _, f in reads] == [(1, True), (2, False)] and reads[1][1] == 1
        plain = reader.pull("Last", queue_id=queue, offset=1, group="G2", sub=sub, expr_type=kind)
        assert bodies(plain) == bodies(held) and plain.ext_fields["nextBeginOffset"] == "3"
    fd = broker.broker.filter_data
    assert fd.metrics_of("G", "Last").to_wire() == fd.metrics_of("G2", "Last").to_wire()
    assert fd.metrics_of("G", "Last").matched == 1 and fd.metrics_of("G", "Last").evaluated == 2
