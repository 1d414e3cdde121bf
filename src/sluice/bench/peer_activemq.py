"""ActiveMQ (Classic) as a peer over STOMP: JMS selectors evaluated by the broker.

Durable topic subscriptions with a selector each (``tag = 'TagA'``, ``region = 'eu'``, and ``region = 'eu' AND a IN
('50', ..., '99')``: STOMP headers arrive as strings, and JMS compares strings with ``=`` only) are made before the
writes and left offline, so the broker keeps each one's matches in KahaDB; the drains reconnect to them. A topic
subscription gets only what is published while it exists, so there is no catch-up case. Producers send persistent
messages, 32 per receipt (the receipt of the last confirms the batch, frames being handled in order). The broker
runs from its jar with a temporary base and data directory and a STOMP connector on a free loopback port."""
from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.bench.procs import PeerProcess, PeerMissing, free_port, require
from sluice.bench.workload import (
    FILTERS, LATENCY_FILTER, Counter, Filter, LatencyProbe, Props, Workload, body_with_stamp,
    expected_counts, generate, paced, settle_heap, produce_rate, wait_until,
)

__all__ = ["SELECTORS", "check", "run"]

HOME = Path("/usr/share/activemq")
JAR = HOME / "bin" / "activemq.jar"
TOPIC = "/topic/bench"
LAT_TOPIC = "/topic/bench-latency"
#: The JMS selector of each drain (string comparisons: STOMP headers are strings).
SELECTORS = {
    "tag": "tag = 'TagA'",
    "region": "region = 'eu'",
    "sql92": "region = 'eu' AND a IN (" + ", ".join(f"'{a}'" for a in range(50, 100)) + ")",
}
CATCHUP = "a topic subscription gets only what is published while it exists, so there is no catch-up"
CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="bench" dataDirectory="{data}"
          schedulerSupport="false" advisorySupport="false">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}?transport.tcpNoDelay=true"/>
    </transportConnectors>
  </broker>
</beans>
"""


def check() -> str:
    if not JAR.exists():
        raise PeerMissing(f"activemq is not installed ({JAR} is missing): run scripts/install-peers.sh")
    require("java", "stomp", "stomp.py")
    return str(JAR)


def _connect(port: int, client_id: str | None = None, listener: Any = None) -> Any:
    import stomp
    c = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    if listener is not None:
        c.set_listener("bench", listener)
    c.connect(wait=True, headers={"client-id": client_id} if client_id else {})
    # stomp.py leaves Nagle on; every other client here (and Sluice's asyncio transport) turns it off.
    sock = getattr(c.transport, "socket", None)
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def _close(c: Any, timeout: float = 10.0) -> None:
    """DISCONNECT and wait for its receipt: stomp.py returns at once, and a durable subscriber whose connection is
    still open gets (and keeps, unacknowledged) what is published meanwhile."""
    c.disconnect()
    deadline = time.monotonic() + timeout
    while c.is_connected() and time.monotonic() < deadline:
        time.sleep(0.01)


def _headers(p: Props) -> dict[str, str]:
    return {"tag": p.tag, "region": p.region, "a": str(p.a), "persistent": "true"}


def _subscribe(c: Any, name: str, f: Filter, ack: str = "client") -> None:
    c.subscribe(TOPIC, id=name, ack=ack, headers={"activemq.subscriptionName": name, "selector": SELECTORS[f.name],
                                                  "activemq.prefetchSize": "1000"})


class _Receipts:
    """Waits for STOMP receipts by id (the listener runs on stomp.py's receiver thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._seen: set[str] = set()
        self.errors: list[str] = []

    def on_receipt(self, frame: Any) -> None:
        with self._cond:
            self._seen.add(frame.headers.get("receipt-id", ""))
            self._cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self._cond:
            self.errors.append(frame.headers.get("message", frame.body))
            self._cond.notify_all()

    def wait(self, rid: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while rid not in self._seen:
                if self.errors:
                    raise RuntimeError(f"activemq error: {self.errors[0]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no receipt {rid} within {timeout:g} s")
                self._cond.wait(left)
            self._seen.discard(rid)


def _produce(port: int, props: list[Props], wl: Workload) -> float:
    body = body_with_stamp(wl.body_size).decode()

    def work(n: int, part: list[Props]) -> None:
        receipts = _Receipts()
        c = _connect(port, listener=receipts)
        for i in range(0, len(part), wl.batch):
            batch = part[i:i + wl.batch]
            for p in batch[:-1]:
                c.send(TOPIC, body=body, headers=_headers(p))
            rid = f"p{n}-{i}"
            c.send(TOPIC, body=body, headers={**_headers(batch[-1]), "receipt": rid})
            receipts.wait(rid)
        _close(c)

    return produce_rate(work, props, wl.threads, "activemq produce")


def _drain(port: int, name: str, f: Filter, expected: int, timeout: float) -> dict[str, Any]:
    counter = Counter(expected)
    wrong = [0]
    unacked: list[str] = []
    box: list[Any] = []

    class Listener:
        def on_message(self, frame: Any) -> None:
            h = frame.headers
            if f.matches(Props(h.get("tag", ""), h.get("region", ""), int(h.get("a", "-1")))):
                counter.add()
            else:
                wrong[0] += 1
            unacked.append(h["ack"])
            if len(unacked) >= 100 or counter.count >= expected:
                box[0].ack(unacked[-1])  # client mode: cumulative
                unacked.clear()

    started = time.perf_counter()
    c = _connect(port, f"bench-{name}", Listener())
    box.append(c)
    _subscribe(c, name, f)
    counter.wait(timeout)
    _close(c)
    return counter.drained(started, timeout, wrong[0], SELECTORS[f.name])


def _latency(port: int, wl: Workload, step: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for rate in wl.latency_rates:
        step(f"activemq: latency at {rate:,} msgs/s")
        probe = LatencyProbe()

        class Listener:
            def on_message(self, frame: Any) -> None:
                probe.seen(frame.body.encode() if isinstance(frame.body, str) else frame.body)

        c = _connect(port, listener=Listener())
        c.subscribe(LAT_TOPIC, id="lat", ack="auto", headers={"selector": SELECTORS["region"]})
        receipts = _Receipts()
        p_conn = _connect(port, listener=receipts)
        p_conn.send(LAT_TOPIC, body="ready", headers={"region": "none", "receipt": "ready"})
        receipts.wait("ready")
        sent = expected = 0
        t0 = time.perf_counter()
        for due, p in paced(rate, wl.latency_seconds, wl.seed + rate):
            wait_until(due)
            p_conn.send(LAT_TOPIC, body=body_with_stamp(wl.body_size, time.perf_counter_ns()).decode(),
                        headers=_headers(p))
            sent += 1
            expected += LATENCY_FILTER.matches(p)
        seconds = time.perf_counter() - t0
        probe.wait_for(expected, 30)
        _close(p_conn)
        _close(c)
        results[str(rate)] = probe.summary(sent, expected, seconds)
    return results


def run(wl: Workload, workdir: Path, step: Callable[[str], None]) -> dict[str, Any]:
    jar = check()
    java = shutil.which("java") or "java"
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    (workdir / "activemq.xml").write_text(CONFIG.format(data=data, port=port))
    argv = [java, "-Xms256M", "-Xmx1G", f"-Dactivemq.classpath={workdir}", f"-Dactivemq.home={HOME}",
            f"-Dactivemq.base={workdir}", f"-Dactivemq.conf={workdir}", f"-Dactivemq.data={data}",
            "-jar", jar, "start", f"xbean:file:{workdir / 'activemq.xml'}"]
    props = generate(wl.messages, wl.seed)
    expected = expected_counts(props)
    settle_heap()
    out: dict[str, Any] = {"produce": {}, "drains": {}}
    step("activemq: starting the broker (KahaDB, STOMP)")
    with PeerProcess.start("activemq", argv, port, workdir, timeout=120) as server:
        for f in FILTERS:  # durable subscriptions made before the writes, then left offline
            c = _connect(port, f"bench-before-{f.name}")
            _subscribe(c, f"before-{f.name}", f)
            _close(c)
        step(f"activemq: produce {wl.messages:,} messages")
        out["produce"]["msgs_per_s"] = round(_produce(port, props, wl))
        for f in FILTERS:
            step(f"activemq: {f.name} drain (before)")
            out["drains"][f.name] = {"before": _drain(port, f"before-{f.name}", f, expected[f.name],
                                                      wl.drain_timeout),
                                     "catchup": {"unsupported": CATCHUP}}
        out["server_rss_bytes"] = server.rss()
        out["handler_on_io_thread"] = True  # stomp.py calls its listener on the connection's receiver thread
        out["latency"] = _latency(port, wl, step)
    return out
