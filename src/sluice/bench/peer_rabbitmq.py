"""RabbitMQ as a peer: routing at publish time through exchanges, durable queues, persistent messages.

A topic exchange (routing key ``<tag>.<region>.<a>``) feeds the tag queue (``TagA.#``) and the region queue
(``*.eu.*``); a headers exchange bound to it (``#``) feeds the SQL92 queue through 50 bindings (``x-match: all``,
``region = eu`` and ``a`` = 50..99). Producers publish in transactions of 32 (``tx_commit`` returns once the
persistent messages are routed and stored). A queue receives only what is routed while it is bound, so there is no
catch-up case. The node runs with its own name, data directory, ports and epmd (all on loopback, by environment),
started and stopped by pid."""
from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.bench.procs import PeerProcess, free_port, require
from sluice.bench.workload import (
    FILTERS, LATENCY_FILTER, Counter, Filter, LatencyProbe, Props, Workload, body_with_stamp,
    expected_counts, generate, paced, settle_heap, produce_rate, wait_until,
)

__all__ = ["check", "run"]

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
TOPIC_X = "bench.topic"
HEADERS_X = "bench.headers"
LAT_X = "bench.latency"
CATCHUP = "a queue receives only what is routed while it is bound, so there is no catch-up"


def check() -> str:
    path = require(SERVER if Path(SERVER).exists() else "rabbitmq-server", "pika", "pika")
    require("epmd", "pika", "pika")
    return path


def _connect(port: int) -> Any:
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0,
                                                             blocked_connection_timeout=300))


def _props_of(p: Props) -> Any:
    import pika
    return pika.BasicProperties(delivery_mode=2, headers={"tag": p.tag, "region": p.region, "a": str(p.a)})


def _key(p: Props) -> str:
    return f"{p.tag}.{p.region}.{p.a}"


def _declare(port: int) -> None:
    conn = _connect(port)
    ch = conn.channel()
    ch.exchange_declare(TOPIC_X, "topic", durable=True)
    ch.exchange_declare(HEADERS_X, "headers", durable=True)
    ch.exchange_declare(LAT_X, "topic", durable=True)
    ch.exchange_bind(destination=HEADERS_X, source=TOPIC_X, routing_key="#")
    for f in FILTERS:
        ch.queue_declare(f"before-{f.name}", durable=True)
    ch.queue_bind("before-tag", TOPIC_X, routing_key="TagA.#")
    ch.queue_bind("before-region", TOPIC_X, routing_key="*.eu.*")
    for a in range(50, 100):  # a headers exchange matches values exactly: one binding per admitted value
        ch.queue_bind("before-sql92", HEADERS_X, arguments={"x-match": "all", "region": "eu", "a": str(a)})
    conn.close()


def _produce(port: int, props: list[Props], wl: Workload) -> float:
    body = body_with_stamp(wl.body_size)

    def work(n: int, part: list[Props]) -> None:
        conn = _connect(port)
        ch = conn.channel()
        ch.tx_select()
        for i in range(0, len(part), wl.batch):
            for p in part[i:i + wl.batch]:
                ch.basic_publish(TOPIC_X, _key(p), body, _props_of(p))
            ch.tx_commit()
        conn.close()

    return produce_rate(work, props, wl.threads, "rabbitmq produce")


def _drain(port: int, queue: str, f: Filter, expected: int, timeout: float) -> dict[str, Any]:
    counter = Counter(expected)
    wrong = 0
    started = time.perf_counter()
    conn = _connect(port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    deadline = time.monotonic() + timeout
    unacked = 0
    for method, props, _body in ch.consume(queue, inactivity_timeout=1.0):
        if method is not None:
            h = props.headers
            if f.matches(Props(h["tag"], h["region"], int(h["a"]))):
                counter.add()
            else:
                wrong += 1
            unacked += 1
            if unacked >= 100 or counter.count >= expected:
                ch.basic_ack(method.delivery_tag, multiple=True)
                unacked = 0
        if counter.count >= expected or time.monotonic() > deadline:
            break
    ch.cancel()
    conn.close()
    return counter.drained(started, timeout, wrong, f.expression)


def _latency(port: int, wl: Workload, step: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for rate in wl.latency_rates:
        step(f"rabbitmq: latency at {rate:,} msgs/s")
        probe = LatencyProbe()
        stop = threading.Event()
        ready = threading.Event()
        queue = f"latency-{rate}"

        def consume() -> None:
            conn = _connect(port)
            ch = conn.channel()
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, LAT_X, routing_key="*.eu.*")
            ready.set()
            for method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=0.1):
                if method is not None:
                    probe.seen(body)
                if stop.is_set():
                    break
            ch.cancel()
            conn.close()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        ready.wait(30)
        conn = _connect(port)
        ch = conn.channel()
        sent = expected = 0
        t0 = time.perf_counter()
        for due, p in paced(rate, wl.latency_seconds, wl.seed + rate):
            wait_until(due)
            ch.basic_publish(LAT_X, _key(p), body_with_stamp(wl.body_size, time.perf_counter_ns()), _props_of(p))
            sent += 1
            expected += LATENCY_FILTER.matches(p)
        seconds = time.perf_counter() - t0
        conn.close()
        probe.wait_for(expected, 30)
        stop.set()
        t.join(10)
        results[str(rate)] = probe.summary(sent, expected, seconds)
    return results


def run(wl: Workload, workdir: Path, step: Callable[[str], None]) -> dict[str, Any]:
    server_bin = check()
    epmd_bin = shutil.which("epmd") or "epmd"
    port, dist, epmd_port = free_port(), free_port(), free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "enabled_plugins").write_text("[].\n")
    env = {
        "HOME": str(workdir), "RABBITMQ_NODENAME": f"bench{port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1", "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"), "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(workdir / "rabbitmq.pid"), "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
    }
    props = generate(wl.messages, wl.seed)
    expected = expected_counts(props)
    settle_heap()
    out: dict[str, Any] = {"produce": {}, "drains": {}}
    step("rabbitmq: starting epmd and rabbitmq-server")
    # Our own epmd on a free port, so RabbitMQ does not start (and leave running) a shared one.
    with PeerProcess.start("epmd", [epmd_bin, "-port", str(epmd_port), "-address", "127.0.0.1"], epmd_port, workdir,
                           env={"ERL_EPMD_ADDRESS": "127.0.0.1"}, timeout=20):
        with PeerProcess.start("rabbitmq", [server_bin], port, workdir, env=env, timeout=120) as server:
            _declare(port)
            step(f"rabbitmq: produce {wl.messages:,} messages")
            out["produce"]["msgs_per_s"] = round(_produce(port, props, wl))
            for f in FILTERS:
                step(f"rabbitmq: {f.name} drain (before)")
                out["drains"][f.name] = {
                    "before": _drain(port, f"before-{f.name}", f, expected[f.name], wl.drain_timeout),
                    "catchup": {"unsupported": CATCHUP},
                }
            out["server_rss_bytes"] = server.rss()
            out["handler_on_io_thread"] = True  # pika's BlockingConnection calls the consumer callback on the consuming thread
            out["latency"] = _latency(port, wl, step)
    return out
