"""Delivery guarantees with consumers in separate OS processes (tests/client/consumer_worker.py):

* at least once: three members of a group, one SIGKILLed mid-stream: nothing is lost, and duplicates
  stay within the in-flight window;
* orderly: per-queue order holds while members join and leave (no two members ever work on one queue
  at the same time, and every queue's messages are first consumed in offset order);
* broadcasting: every member gets every message.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from push_support import Cluster, Worker, cluster, start_worker, unique, wait_for  # noqa: F401 (a fixture)

from sluice import Message, Producer
from sluice.client.results import MessageQueue

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

QUEUES = 8
PULL_BATCH = 32  # the workers' pull_batch_size (the default)


def _create_topic(p: Producer, topic: str) -> list[MessageQueue]:
    p.send(Message(topic, b"create"))
    wait_for(lambda: len(p.fetch_publish_queues(topic)) == QUEUES, 10, f"{QUEUES} queues of {topic}")
    return p.fetch_publish_queues(topic)


def _owned(w: Worker) -> set[str] | None:
    """The queues the worker said it owns last, or None before it said anything."""
    try:
        lines = [ln for ln in w.log.read_text().splitlines() if ln.startswith("#owned")]
    except FileNotFoundError:
        return None
    if not lines:
        return None
    parts = lines[-1].split(" ", 2)
    return set(parts[2].split(",")) - {""} if len(parts) == 3 else set()


def _settled(workers: list[Worker]) -> bool:
    """Every worker owns some queues, none twice, all covered (the group finished rebalancing)."""
    owned = [_owned(w) for w in workers]
    if any(o is None or not o for o in owned):
        return False
    flat = [q for o in owned for q in o]  # type: ignore[union-attr]
    return len(flat) == len(set(flat)) == QUEUES


def _send_stream(p: Producer, topic: str, n: int, rate: float, *, ordered: list[MessageQueue] | None = None
                 ) -> threading.Thread:
    def run() -> None:
        t0 = time.monotonic()
        for i in range(n):
            if ordered is not None:
                q = ordered[i % len(ordered)]
                p.send(Message(topic, f"{q.queue_id}:{i // len(ordered)}".encode()), queue=q)
            else:
                p.send(Message(topic, f"m{i}".encode()))
            ahead = t0 + (i + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _stop_all(workers: list[Worker]) -> None:
    for w in workers:
        w.stop()


def test_at_least_once_when_a_member_is_killed(cluster: Cluster, tmp_path: Path) -> None:
    topic, group = unique("AloT"), unique("cg")
    n = 2000
    with Producer(unique("pg"), namesrv=cluster.ns, default_topic_queue_nums=QUEUES) as p:
        _create_topic(p, topic)
        workers = [start_worker(tmp_path, f"w{i}", cluster.ns, group, topic) for i in range(3)]
        try:
            wait_for(lambda: _settled(workers), 30, "three members sharing the queues")
            sender = _send_stream(p, topic, n, rate=500.0)
            wait_for(lambda: len(workers[0].lines()) >= 100, 20, "the victim to be consuming")
            victim_done = len(workers[0].lines())
            workers[0].kill()  # SIGKILL mid-stream
            sender.join(60)
            assert not sender.is_alive()
            want = {f"m{i}" for i in range(n)}

            def all_consumed() -> bool:
                return {ln[7] for w in workers for ln in w.lines()} >= want
            wait_for(all_consumed, 60, "every message consumed by the group", interval=0.2)
        finally:
            _stop_all(workers)
    bodies = Counter(ln[7] for w in workers for ln in w.lines() if ln[7] != "create")
    assert set(bodies) == want  # nothing lost, nothing foreign
    duplicates = sum(bodies.values()) - len(bodies)
    # In flight when the victim died: what it had consumed since its queues' last committed offset (a commit
    # rides on each pull, and runs every 5 s): at most a pull batch consumed and one being consumed on each of
    # its queues (3 of 8; the survivors hand over theirs with a commit first).
    bound = -(-QUEUES // 3) * 2 * PULL_BATCH
    print(f"at-least-once: {n} sent, victim consumed {victim_done}+ before SIGKILL, {duplicates} duplicates "
          f"(bound {bound})")
    assert duplicates <= bound


def test_orderly_order_holds_while_members_join_and_leave(cluster: Cluster, tmp_path: Path) -> None:
    topic, group = unique("OrdT"), unique("cg")
    per_queue = 120
    with Producer(unique("pg"), namesrv=cluster.ns, default_topic_queue_nums=QUEUES) as p:
        queues = _create_topic(p, topic)
        args = ("--orderly", "--work-ms", "2")
        workers = [start_worker(tmp_path, f"o{i}", cluster.ns, group, topic, *args) for i in range(2)]
        try:
            wait_for(lambda: _settled(workers), 30, "two orderly members")
            sender = _send_stream(p, topic, per_queue * QUEUES, rate=300.0, ordered=queues)
            time.sleep(1.0)
            workers.append(start_worker(tmp_path, "o2", cluster.ns, group, topic, *args))  # a member joins
            wait_for(lambda: _settled(workers), 30, "three orderly members")
            time.sleep(0.5)
            workers[0].stop()  # a member leaves gracefully
            live = workers[1:]
            wait_for(lambda: _settled(live), 30, "two remaining members")
            sender.join(60)
            assert not sender.is_alive()
            want = {f"{q.queue_id}:{s}" for q in queues for s in range(per_queue)}
            wait_for(lambda: {ln[7] for w in workers for ln in w.lines()} >= want, 60, "all ordered messages",
                     interval=0.2)
        finally:
            _stop_all(workers)
    calls: dict[str, list[tuple[int, int, str, int]]] = {}
    for w in workers:
        for ln in w.lines():
            if ln[7] == "create":
                continue
            q, seq = ln[7].split(":")
            calls.setdefault(q, []).append((int(ln[5]), int(ln[6]), ln[0], int(seq)))
    redelivered = 0
    for q, cs in calls.items():
        cs.sort()
        last_end: dict[str, int] = {}
        for start, end, who, _ in cs:
            for other, e in last_end.items():
                assert other == who or start >= e, f"queue {q}: {who} started while {other} was consuming"
            last_end[who] = end
        first: dict[int, int] = {}
        for start, _, _, seq in cs:
            first.setdefault(seq, start)
        order = [seq for seq, _ in sorted(first.items(), key=lambda kv: kv[1])]
        assert order == sorted(order) == list(range(per_queue)), f"queue {q} first consumed out of order"
        redelivered += len(cs) - len(first)
    owners = {q: {who for _, _, who, _ in cs} for q, cs in calls.items()}
    assert any(len(o) > 1 for o in owners.values())  # queues really changed hands
    print(f"orderly: {per_queue * QUEUES} messages, {redelivered} re-deliveries at hand-overs")


def test_broadcasting_delivers_everything_to_every_member(cluster: Cluster, tmp_path: Path) -> None:
    topic, group = unique("BcT"), unique("cg")
    n = 300
    with Producer(unique("pg"), namesrv=cluster.ns, default_topic_queue_nums=QUEUES) as p:
        _create_topic(p, topic)
        args = ("--model", "BROADCASTING", "--offset-dir", str(tmp_path / "offsets"))
        workers = [start_worker(tmp_path, f"b{i}", cluster.ns, group, topic, *args) for i in range(3)]
        try:
            for w in workers:
                wait_for(lambda w=w: len(_owned(w) or ()) == QUEUES, 30, f"{w.name} to own every queue")
            _send_stream(p, topic, n, rate=1000.0).join(30)
            want = Counter(f"m{i}" for i in range(n))
            for w in workers:
                wait_for(lambda w=w: Counter(ln[7] for ln in w.lines()) == want, 30,
                         f"every message at {w.name}", interval=0.2)
        finally:
            _stop_all(workers)
    for w in workers:
        assert Counter(ln[7] for ln in w.lines()) == want
        assert (tmp_path / "offsets" / w.name / group / "offsets.json").exists()
