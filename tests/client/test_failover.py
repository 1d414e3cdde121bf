"""Two brokers in one cluster: sends keep succeeding on the survivor when one is killed."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sdk_support import needs_broker, start_broker, wait_for, wait_for_route
from servers import SluiceProcess

from sluice import Message, Producer, PullConsumer, SendStatus

pytestmark = [pytest.mark.integration, needs_broker]


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[tuple[SluiceProcess, SluiceProcess, SluiceProcess]]:
    with SluiceProcess.start(["namesrv"], tmp_path, name="namesrv") as ns:
        a = start_broker(tmp_path, ns.addr, "broker-a")
        b = start_broker(tmp_path, ns.addr, "broker-b")
        try:
            wait_for_route(ns.addr, "TBW102", brokers=2)
            yield ns, a, b
        finally:
            a.stop()
            b.stop()


@pytest.mark.parametrize("fault_enabled", [False, True])
def test_sends_avoid_a_dead_broker(two_brokers, fault_enabled: bool):
    ns, a, b = two_brokers
    topic = "Failover"
    with Producer("PG_fail", ns.addr, send_latency_fault_enable=fault_enabled, send_timeout=5.0) as p:
        # Auto-created through TBW102 on both brokers: round robin spreads the first sends over both.
        first = [p.send(Message(topic, f"before-{i}".encode())) for i in range(8)]
        assert Counter(r.queue.broker_name for r in first) == {"broker-a": 4, "broker-b": 4}
        a.kill()
        after = [p.send(Message(topic, f"after-{i}".encode())) for i in range(20)]
        assert all(r.status is SendStatus.SEND_OK and r.queue.broker_name == "broker-b" for r in after)
        if fault_enabled:
            assert not p.async_producer.fault.tolerance.is_available("broker-a")
    wanted = {f"after-{i}".encode() for i in range(20)}
    with PullConsumer("CG_fail", ns.addr) as c:
        queues = [q for q in c.fetch_message_queues(topic) if q.broker_name == "broker-b"]

        def bodies() -> bool:  # bounded wait: the broker makes messages pullable just after storing them
            return wanted <= {m.body for q in queues for m in c.pull(q, "*", 0, 64).msg_found_list}
        wait_for(bodies, 10, "messages sent after the kill pullable on broker-b")
