"""Online offset resets reach a running push consumer.

`sluice admin resetOffsetByTime` (in-process) asks a real broker subprocess, which commits the new offsets
and sends RESET_CONSUMER_CLIENT_OFFSET to the group's online members. The running consumer must drop what
it caches, consume from the new offsets and commit them, never its old position. A gated listener holds
the consumer still after the reset, so the committed offsets observed then are what the consumer itself
persists (within ``persist_offset_interval``), not only the broker's own commit. Last, a remoting server
plays a broker relaying GET_CONSUMER_RUNNING_INFO and malformed resets over the consumer's own connection.
"""
from __future__ import annotations

import asyncio
import io
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from push_support import Cluster, cluster, unique, wait_for  # noqa: F401 (a fixture)

from sluice import AsyncPushConsumer, ConsumeOrderlyResult, ConsumeResult, Message, MessageExt, Producer, PushConsumer
from sluice.admin import ExitStatus, main
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection
from sluice.protocol.offset_table import decode_queue_table
from sluice.transport.server import RemotingServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: persist_offset_interval of the consumers: an old position would be committed again within it.
PERSIST = 0.3


class GatedSink:
    """Records each message handed to the listener (``entered``) and each one consumed (``done``); while
    ``gate`` is clear, listener calls wait for it (bounded, then 'later')."""

    def __init__(self, result: object = ConsumeResult.SUCCESS) -> None:
        self.lock = threading.Lock()
        self.entered: list[MessageExt] = []
        self.done: list[MessageExt] = []
        self.gate = threading.Event()
        self.gate.set()
        self.result = result

    def __call__(self, msgs: list[MessageExt]) -> object:
        with self.lock:
            self.entered.extend(msgs)
        if not self.gate.wait(30):
            return ConsumeResult.RECONSUME_LATER
        with self.lock:
            self.done.extend(msgs)
        return self.result

    def entered_bodies(self, start: int = 0) -> list[str]:
        with self.lock:
            return [m.body.decode() for m in self.entered[start:]]

    def done_bodies(self, start: int = 0) -> list[str]:
        with self.lock:
            return [m.body.decode() for m in self.done[start:]]

    def done_msgs(self, start: int = 0) -> list[MessageExt]:
        with self.lock:
            return list(self.done[start:])


def admin(c: Cluster, *argv: str) -> Any:
    """``sluice admin ARGV --json -n <namesrv>`` in-process; its JSON result (exit status checked)."""
    out, err = io.StringIO(), io.StringIO()
    status = main([*argv, "--json", "-n", c.ns], {}, stdout=out, stderr=err, stdin=io.BytesIO())
    assert status is ExitStatus.SUCCESS, err.getvalue()
    return orjson.loads(out.getvalue())


def committed(c: Cluster, group: str, topic: str) -> dict[int, int]:
    return {e["queueId"]: e["consumerOffset"]
            for e in admin(c, "consumerProgress", "-g", group, "-t", topic)["offsetTable"]}


def lag(c: Cluster, group: str, topic: str) -> int:
    return int(admin(c, "consumerProgress", "-g", group, "-t", topic)["totalLag"])


def reset(c: Cluster, group: str, topic: str, when: int, consumer: PushConsumer) -> dict[int, int]:
    """resetOffsetByTime to ``when`` (ms); checks the consumer was told; the new offset per queue."""
    res = admin(c, "resetOffsetByTime", "-g", group, "-t", topic, "-s", str(when))
    assert res["notifiedClients"] == [consumer.async_consumer.instance.client_id]
    return {e["queueId"]: e["offset"] for e in res["offsetTable"]}


def send_all(p: Producer, topic: str, bodies: list[str]) -> None:
    for b in bodies:
        p.send(Message(topic, b.encode()))


def make_topic(c: Cluster, topic: str) -> Producer:
    """A started producer and ``topic`` created (8 queues) by one message, "create". Its own client instance:
    the first user of an instance sets its persist_offset_interval, and the consumers want theirs."""
    p = Producer(unique("pg"), namesrv=c.ns, default_topic_queue_nums=8, instance_name=unique("producer"))
    p.start()
    p.send(Message(topic, b"create"))
    wait_for(lambda: len(p.fetch_publish_queues(topic)) == 8, 10, f"8 queues of {topic}")
    return p


def between(p: Producer, topic: str, before: list[str], after: list[str]) -> int:
    """Send ``before``, then ``after``; a store timestamp (ms) that falls between them."""
    send_all(p, topic, before)
    time.sleep(0.05)
    when = int(time.time() * 1000)
    time.sleep(0.05)
    send_all(p, topic, after)
    return when


def held_at(c: Cluster, group: str, topic: str, want: dict[int, int]) -> None:
    """The committed offsets reach ``want`` and stay there over several of the consumer's commit periods."""
    wait_for(lambda: committed(c, group, topic) == want, 10, f"committed offsets {want}")
    time.sleep(3 * PERSIST)
    assert committed(c, group, topic) == want


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_reset_back_in_time_redelivers_exactly_the_later_messages(cluster: Cluster, orderly: bool) -> None:
    topic, group = unique("RstBackT"), unique("rcg")
    old, new = [f"old-{i}" for i in range(12)], [f"new-{i}" for i in range(24)]
    with make_topic(cluster, topic) as p:
        when = between(p, topic, old, new)
    sink = GatedSink(ConsumeOrderlyResult.SUCCESS if orderly else ConsumeResult.SUCCESS)
    cons = PushConsumer(group, namesrv=cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                        persist_offset_interval=PERSIST)
    cons.subscribe(topic, "*")
    cons.register_listener(sink, orderly=orderly)
    cons.start()
    try:
        everything = Counter(["create", *old, *new])
        wait_for(lambda: Counter(sink.done_bodies()) == everything, 20, "the first pass")
        wait_for(lambda: lag(cluster, group, topic) == 0, 10, "the first pass committed")
        ends = committed(cluster, group, topic)

        sink.gate.clear()  # hold the re-delivered messages in the listener
        mark = len(sink.done_bodies())
        to = reset(cluster, group, topic, when, cons)
        assert sum(ends[q] - to[q] for q in ends) == len(new)  # back over exactly the later messages
        wait_for(lambda: len(sink.entered_bodies()) > len(everything), 10, "a re-delivery")
        # The consumer persists the reset, not the old end it had committed (which the fix prevents).
        held_at(cluster, group, topic, to)

        sink.gate.set()
        wait_for(lambda: len(sink.done_bodies(mark)) >= len(new), 20, "the later messages again")
        wait_for(lambda: committed(cluster, group, topic) == ends, 10, "progress past the re-delivery")
        time.sleep(0.3)
        again = sink.done_msgs(mark)
        assert Counter(m.body.decode() for m in again) == Counter(new)  # each later one once, no earlier one
        if orderly:
            per_queue: dict[int, list[int]] = {}
            for m in again:
                per_queue.setdefault(m.queue_id, []).append(m.queue_offset)
            assert all(offs == sorted(offs) for offs in per_queue.values())
            assert {q: min(offs) for q, offs in per_queue.items()} == {q: to[q] for q in per_queue}
    finally:
        sink.gate.set()
        cons.shutdown()


def cached(cons: PushConsumer) -> int:
    """Messages the consumer holds (cached or with the listener); a test-side peek from another thread."""
    try:
        return sum(pq.msg_count for pq in list(cons.async_consumer.rebalancer.process_queues.values()))
    except RuntimeError:  # the table changed while read
        return -1


def test_reset_forward_skips_cached_messages(cluster: Cluster) -> None:
    topic, group = unique("RstFwdT"), unique("rcg")
    skip, keep, later = ([f"{k}-{i}" for i in range(16)] for k in ("skip", "keep", "later"))
    sink = GatedSink()
    # One listener thread, one message per call: exactly one skipped message is with the listener.
    cons = PushConsumer(group, namesrv=cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                        persist_offset_interval=PERSIST, consume_thread_max=1, pull_batch_size=4)
    cons.subscribe(topic, "*")
    cons.register_listener(sink)
    with make_topic(cluster, topic) as p:
        cons.start()
        try:
            wait_for(lambda: sink.done_bodies() == ["create"], 20, "the first message")
            wait_for(lambda: lag(cluster, group, topic) == 0, 10, "the first message committed")
            sink.gate.clear()
            send_all(p, topic, skip[:1])
            wait_for(lambda: sink.entered_bodies(1) == skip[:1], 10, "a message held by the listener")
            when = between(p, topic, skip[1:], keep)
            wait_for(lambda: cached(cons) == len(skip) + len(keep), 10, "everything pulled and cached")

            to = reset(cluster, group, topic, when, cons)
            assert sum(to.values()) == 1 + len(skip)  # each queue at its first "keep" message
            # New pulls (each carries the consumer's offset for the broker to commit), listener still held:
            # the consumer keeps the reset offsets and caches only what comes after them.
            send_all(p, topic, later)
            wait_for(lambda: cached(cons) == len(keep) + len(later), 10, "the kept and later messages cached")
            held_at(cluster, group, topic, to)

            sink.gate.set()
            wait_for(lambda: Counter(sink.done_bodies(1)) == Counter([*skip[:1], *keep, *later]), 20,
                     "the kept and later messages")
            wait_for(lambda: lag(cluster, group, topic) == 0, 10, "everything committed")
            time.sleep(0.3)
            # The skipped messages never reach the listener, except the one it held at the reset.
            assert sink.entered_bodies(1) == sink.done_bodies(1)
            assert Counter(sink.done_bodies(1)) == Counter([*skip[:1], *keep, *later])
        finally:
            sink.gate.set()
            cons.shutdown()


def file_offsets(path: Path, topic: str) -> dict[int, int]:
    try:
        doc = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return {e["queueId"]: e["offset"] for e in doc["offsetTable"] if e["topic"] == topic}


def test_broadcasting_consumer_applies_a_reset_to_its_local_offsets(cluster: Cluster, tmp_path: Path) -> None:
    topic, group, name = unique("RstBcastT"), unique("rcg"), unique("member")
    old, new = [f"old-{i}" for i in range(8)], [f"new-{i}" for i in range(16)]
    with make_topic(cluster, topic) as p:
        when = between(p, topic, old, new)
    sink = GatedSink()
    cons = PushConsumer(group, namesrv=cluster.ns, message_model="BROADCASTING", instance_name=name,
                        offset_store_dir=str(tmp_path), consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                        persist_offset_interval=PERSIST)
    cons.subscribe(topic, "*")
    cons.register_listener(sink)
    cons.start()
    path = tmp_path / name / group / "offsets.json"
    try:
        total = 1 + len(old) + len(new)
        wait_for(lambda: len(sink.done_bodies()) == total, 20, "the first pass")
        wait_for(lambda: sum(file_offsets(path, topic).values()) == total, 10, "the first pass in the file")
        ends = file_offsets(path, topic)

        sink.gate.clear()
        to = reset(cluster, group, topic, when, cons)
        assert sum(ends[q] - to[q] for q in ends) == len(new)
        wait_for(lambda: file_offsets(path, topic) == to, 10, "the reset in the local file")
        time.sleep(3 * PERSIST)
        assert file_offsets(path, topic) == to

        sink.gate.set()
        wait_for(lambda: len(sink.done_bodies(total)) >= len(new), 20, "the later messages again")
        wait_for(lambda: file_offsets(path, topic) == ends, 10, "progress past the re-delivery")
        time.sleep(0.3)
        assert Counter(sink.done_bodies(total)) == Counter(new)
    finally:
        sink.gate.set()
        cons.shutdown()


async def until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout:g} s")
        await asyncio.sleep(0.05)


def test_running_info_and_bad_resets_over_a_real_connection(cluster: Cluster) -> None:
    """A remoting server in the test plays a broker relaying admin requests over the consumer's own connection:
    GET_CONSUMER_RUNNING_INFO is answered in Java's shape; a malformed reset is refused and changes nothing."""
    topic, group = unique("RunInfoT"), unique("rcg")
    first = [f"m-{i}" for i in range(9)]
    with make_topic(cluster, topic) as p:
        send_all(p, topic, first[1:])  # with "create": 9 messages

    async def scenario() -> None:
        sink = GatedSink()
        sink.gate.clear()  # the first messages stay with the listener: cached, not committed
        cons = AsyncPushConsumer(group, cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        cons.subscribe(topic, "*")
        cons.register_listener(sink)
        probe = RemotingServer()
        opened: asyncio.Queue[RemotingConnection] = asyncio.Queue()
        probe.on_connection_open(opened.put_nowait)
        await probe.start()
        await cons.start()
        try:
            inst = cons.instance
            await inst.remoting.connection(probe.address)
            conn = await asyncio.wait_for(opened.get(), 5)

            async def running_info(g: str = group) -> RemotingCommand:
                h = H.GetConsumerRunningInfoRequestHeader(consumer_group=g, client_id=inst.client_id)
                return await conn.request(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, h.to_ext()), 5)

            await until(lambda: len(sink.entered) == 9, 15, "9 messages with the listener")
            resp = await running_info()
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert b'"mqTable":{{"brokerName":' in resp.body  # fastjson's object keys, as Java tools decode
            doc, queues = decode_queue_table(resp.body, "mqTable")
            assert {s["topic"] for s in doc["subscriptionSet"]} == {topic, f"%RETRY%{group}"}
            assert doc["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
            assert doc["properties"]["PROP_CONSUMEORDERLY"] == "false"
            assert (doc["properties"]["consumeInline"], doc["properties"]["PROP_THREADPOOL_CORE_SIZE"]) == ("false", "20")
            mine = [q for q in queues if q["topic"] == topic]
            assert len(mine) == 8 and sum(q["cachedMsgCount"] for q in mine) == 9
            assert all(q["commitOffset"] == 0 for q in mine)

            unknown = await running_info("no-such-group")
            assert unknown.code == ResponseCode.SYSTEM_ERROR and "not exist" in (unknown.remark or "")

            # Malformed or foreign resets: refused or ignored, the consumer keeps its queues and cache.
            for body, group_, code in ((b"{nonsense", group, ResponseCode.INVALID_PARAMETER),
                                       (b'{"offsetTable":[]}', "other-group", ResponseCode.SUCCESS)):
                h = H.ResetOffsetRequestHeader(topic=topic, group=group_, timestamp=0)
                req = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, h.to_ext(), body)
                assert (await conn.request(req, 5)).code == code
            assert len(cons.owned_queues()) >= 8 and sum(pq.msg_count for pq in
                                                        cons.rebalancer.process_queues.values()) == 9

            sink.gate.set()
            await until(lambda: len(sink.done) == 9, 15, "the messages consumed")
            after = decode_queue_table((await running_info()).body, "mqTable")[1]
            mine = [q for q in after if q["topic"] == topic]
            assert sum(q["cachedMsgCount"] for q in mine) == 0 and sum(q["commitOffset"] for q in mine) == 9
        finally:
            sink.gate.set()
            await cons.shutdown()
            await probe.close()

    asyncio.run(scenario())
