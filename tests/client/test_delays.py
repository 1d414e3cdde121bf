"""Delayed delivery against a real broker: delay levels (shrunk), deliver-at / relative delays with 1 s
precision, refusals, and both kinds surviving a broker crash and a graceful restart."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from push_support import Cluster, cluster, start_cluster, start_consumer, stop_cluster, unique, wait_for  # noqa: F401

from sluice import ConsumeResult, Message, MessageExt, Producer, PushConsumer
from sluice.broker.schedule import TIMER_OUT_MS
from sluice.errors import MessageIllegalError
from sluice.protocol import properties as P

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: The schedule service may deliver this late: 1 s precision plus a tick and the append.
LATE_MS = 1300
#: Clock reads of client and broker differ by scheduling noise only (same host).
EARLY_MS = 30


class Sink:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.msgs: list[MessageExt] = []

    def __call__(self, msgs: list[MessageExt]) -> ConsumeResult:
        with self.lock:
            self.msgs.extend(msgs)
        return ConsumeResult.SUCCESS

    def by_body(self) -> dict[str, MessageExt]:
        with self.lock:
            return {m.body.decode(): m for m in self.msgs}


def _consumer(c: Cluster, topic: str, sink: Sink) -> PushConsumer:
    return start_consumer(c, unique("cg"), topic, sink, consume_from_where="CONSUME_FROM_FIRST_OFFSET")


def test_delay_levels_and_deliver_at_are_on_time(cluster: Cluster) -> None:
    topic = unique("DelayT")
    sink = Sink()
    with Producer(unique("pg"), namesrv=cluster.ns) as p:
        p.send(Message(topic, b"create"))
        cons = _consumer(cluster, topic, sink)
        try:
            t0 = int(time.time() * 1000)
            plans: dict[str, tuple[int, int]] = {}  # body -> (earliest, latest) due time by the client's clock

            def send(body: str, delay_ms: int, **kw: object) -> None:
                before = int(time.time() * 1000)
                p.send(Message(topic, body.encode(), **kw))  # type: ignore[arg-type]
                plans[body] = (before + delay_ms, int(time.time() * 1000) + delay_ms)  # the broker's receipt
            for level, ms in ((2, 200), (5, 500), (10, 1000)):
                send(f"level{level}", ms, delay_level=level)
            for secs in (0.5, 1.5, 2.5):
                send(f"delay{secs}", int(secs * 1000), delay=secs)
            due_at = t0 + 3000
            p.send(Message(topic, b"at", deliver_at=due_at))
            plans["at"] = (due_at, due_at)
            send("past", 0, deliver_at=t0 - 60_000)  # already due: delivered at once
            send("now", 0)
            wait_for(lambda: set(sink.by_body()) >= set(plans), 20, "every delayed message")
            got = sink.by_body()
            for body, (lo, hi) in plans.items():
                m = got[body]
                assert m.topic == topic
                assert lo - EARLY_MS <= m.store_timestamp <= hi + LATE_MS, (body, m.store_timestamp - lo)
                assert P.DELAY not in m.properties and P.TIMER_DELIVER_MS not in m.properties
            assert got["at"].properties[TIMER_OUT_MS] == str(due_at)
            assert got["level10"].properties[P.REAL_TOPIC] == topic
        finally:
            cons.shutdown()


def test_bad_delays_are_refused(cluster: Cluster) -> None:
    topic = unique("DelayBad")
    with Producer(unique("pg"), namesrv=cluster.ns) as p:
        with pytest.raises(MessageIllegalError, match="only one"):
            p.send(Message(topic, b"x", delay_level=3, delay=1.0))
        with pytest.raises(MessageIllegalError, match="deliver_at"):
            p.send(Message(topic, b"x", deliver_at=-5))
        with pytest.raises(MessageIllegalError, match="maximum"):
            p.send(Message(topic, b"x", deliver_at=int(time.time() * 1000) + 500 * 86_400_000))
        with pytest.raises(MessageIllegalError, match="batch"):
            p.send_batch([Message(topic, b"a", delay=1.0), Message(topic, b"b")])


@pytest.mark.slow
def test_delays_survive_a_broker_crash_and_a_restart(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, delay_levels="1s 2s 3s 4s 5s 6s 7s 8s")
    topic = unique("DelayRestart")
    try:
        with Producer(unique("pg"), namesrv=c.ns, send_timeout=10.0) as p:
            p.send(Message(topic, b"create"))
            plans: dict[str, int] = {}
            now = int(time.time() * 1000)
            p.send(Message(topic, b"level6", delay_level=6))
            plans["level6"] = now + 6000
            p.send(Message(topic, b"at7", deliver_at=now + 7000))  # refiled at +4 s and +6 s on its way
            plans["at7"] = now + 7000
            p.send(Message(topic, b"delay9", delay=9.0))
            plans["delay9"] = now + 9000
            time.sleep(1.0)
            c.restart_broker(kill=True)  # SIGKILL: nothing moved yet, everything must still come
            wait_for(lambda: time.time() * 1000 >= now + 4500, 10, "the first timer hop")
            c.restart_broker()  # graceful, between the timer message's hops
            up_ms = int(time.time() * 1000)  # nothing can be delivered while the broker is down
        sink = Sink()
        cons = _consumer(c, topic, sink)
        try:
            wait_for(lambda: set(sink.by_body()) >= set(plans), 30, "the delayed messages after restarts")
            time.sleep(0.5)
            got = sink.by_body()
            assert sorted(m.body.decode() for m in sink.msgs if m.body != b"create") == sorted(plans)  # once each
            for body, due in plans.items():
                late = got[body].store_timestamp - max(due, up_ms)
                assert got[body].store_timestamp >= due - EARLY_MS and late <= LATE_MS, (body, late)
        finally:
            cons.shutdown()
    finally:
        stop_cluster(c)
