"""Every bound of the Trust issue against a real ``sluice broker`` / ``sluice namesrv`` pair run with small
settings, each test showing that a normal SDK client (producer and pull consumer, through the namesrv) is
served while the bound is being pushed against on other connections.

Bounds tested here: partial big frames (frame_budget) and their connections closed when idle, the connection
limit, the idle timeout, held pulls per connection and in all, woken held pulls in slices per loop turn
(max_held_pull_wakes_per_turn), pull answers (max_transfer_bytes, whatever the pull asks), new selector
compilations per client, auto-created topics, one bad send failing alone, namesrv KV caps. Their finer
behaviour is tested beside each: tests/broker/test_pull_bounds.py, test_selector_bounds.py (also the
evaluation budget), test_topic_caps.py, test_send_isolation.py (other sends of the same append round),
test_refusal_log.py, tests/transport/test_limits.py; fuzzed frames and requests: test_frames_fuzz.py, and
under ACL test_acl_fuzz.py. The store's bounds (disk, descriptors, restart memory) have their own files here."""
from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import orjson
import pytest
from servers import Cluster, running_cluster, wait_for

from sluice import Message, Producer, PullConsumer
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame

pytestmark = pytest.mark.slow

IDLE_S = 5.0
BROKER = f"""\
frame_budget = {8 * 1024 * 1024}
max_connections = 48
server_channel_max_idle_time_seconds = {IDLE_S}
max_held_pulls_per_connection = 64
max_held_pulls = 160
max_held_pull_wakes_per_turn = 8
max_transfer_bytes = {64 * 1024}
max_selector_compiles_per_client_per_minute = 10
max_auto_created_topics = 6
"""
NAMESRV = "kv_max_entries = 5\nkv_max_key_bytes = 32\nkv_max_value_bytes = 64\n"
TOPIC = "AbuseBounds"


class Normal:
    """A normal client: sends through the namesrv's route and reads its messages back."""

    def __init__(self, ns: str) -> None:
        self.producer = Producer("PG_bounds_normal", ns, retry_times=1)
        self.producer.start()
        self.consumer = PullConsumer("CG_bounds_normal", ns)
        self.consumer.start()
        self.sent: list[bytes] = []

    def served(self) -> None:
        """One send and a pull of its queue that finds it."""
        body = f"normal-{len(self.sent)}".encode()
        r = self.producer.send(Message(TOPIC, body))
        assert r.status.name == "SEND_OK"
        self.sent.append(body)
        got = self.consumer.pull(r.queue, "*", r.queue_offset)
        assert [m.body for m in got.msg_found_list][:1] == [body]

    def close(self) -> None:
        self.consumer.shutdown()
        self.producer.shutdown()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Normal]]:
    tmp = tmp_path_factory.mktemp("bounds")
    (tmp / "namesrv.toml").write_text(NAMESRV)
    with running_cluster(tmp, ("broker-a",), config=BROKER,
                         namesrv_extra=("--config", str(tmp / "namesrv.toml"))) as c:
        normal = Normal(c.ns)
        try:
            normal.served()
            yield c, normal
        finally:
            normal.close()


def _connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_peer(s: socket.socket, within: float) -> bool:
    """Whether the peer closes ``s`` within ``within`` seconds (whatever it answered before)."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if not s.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def _read(s: socket.socket, n: int, within: float = 15.0) -> list[RemotingCommand]:
    codec = FrameCodec()
    out: list[RemotingCommand] = []
    deadline = time.monotonic() + within
    while len(out) < n and (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            chunk = s.recv(1 << 20)
        except TimeoutError:
            break
        if not chunk:
            break
        codec.receive_data(chunk)
        while (f := codec.next_frame()) is not NEED_DATA:
            out.append(f)
    return out


def _runtime(addr: str) -> dict[str, str]:
    with _connect(addr) as s:
        s.sendall(encode_frame(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {})))
        (resp,) = _read(s, 1)
    return orjson.loads(resp.body)["table"]


def _held_pulls(queue_id: int, offset: int, n: int, first_opaque: int) -> bytes:
    return b"".join(encode_frame(RemotingCommand(
        code=RequestCode.PULL_MESSAGE, opaque=first_opaque + i, ext_fields={
            "consumerGroup": "CG_bounds_held", "topic": TOPIC, "queueId": str(queue_id), "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": str(0x2 | 0x4), "commitOffset": "0", "suspendTimeoutMillis": "20000",
            "subVersion": "0", "subscription": "*", "expressionType": "TAG"})) for i in range(n))


def test_partial_big_frames_hold_at_most_the_budget_and_go_when_idle(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    heads = []
    for _ in range(6):  # each declares a 6 MiB frame and sends 64 KiB of it: 36 MiB declared, 8 MiB budget
        s = _connect(cluster.broker.addr)
        s.sendall(struct.pack(">iI", 6 * 1024 * 1024, 20) + b"{" + b" " * (64 * 1024))
        heads.append(s)
    try:
        def budget() -> dict[str, str] | None:
            t = _runtime(cluster.broker.addr)
            return t if int(t["frameBudgetWaiting"]) == 5 else None
        table = wait_for(budget, 10, "five connections waiting for the frame budget")
        assert 0 < int(table["frameBudgetReserved"]) <= 8 * 1024 * 1024  # one 6 MiB frame reserved; no more
        normal.served()  # small frames are never held back by big ones
        for s in heads:  # no complete frame: closed by the idle timeout, which frees their reservations
            assert _closed_by_peer(s, IDLE_S + 10)
    finally:
        for s in heads:
            s.close()
    table = _runtime(cluster.broker.addr)
    assert table["frameBudgetReserved"] == "0" and table["frameBudgetWaiting"] == "0"  # all given back
    normal.served()


def test_connections_past_the_limit_are_closed_at_accept(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    before = int(_runtime(cluster.broker.addr)["connectionsRefused"])
    normal.served()  # its connection is fresh: the idle timeout will not take it during the test
    extra = [_connect(cluster.broker.addr) for _ in range(60)]
    try:
        normal.served()  # served while the broker is full
    finally:
        for s in extra:
            s.close()
    after = int(wait_for(lambda: _runtime(cluster.broker.addr), 10)["connectionsRefused"])  # accepted again
    assert after - before >= 60 - 48  # at most max_connections kept, the normal client's among them
    normal.served()


def test_idle_connections_are_closed_while_busy_ones_are_served(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    idle = _connect(cluster.broker.addr)
    try:
        deadline = time.monotonic() + IDLE_S + 10
        closed = False
        while time.monotonic() < deadline and not closed:
            normal.served()  # busy all along
            closed = _closed_by_peer(idle, 0.5)
        assert closed
    finally:
        idle.close()


def test_held_pulls_are_bounded_per_connection_and_the_rest_answered_at_once(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    normal.served()
    queue = 0
    offset = int(normal.consumer.max_offset(_queue(normal, queue)))
    before = int(_runtime(cluster.broker.addr)["pullNotHeldOverLimit"])
    with _connect(cluster.broker.addr) as s:
        s.sendall(_held_pulls(queue, offset, 100, 1))  # 64 are held, 36 answered PULL_NOT_FOUND at once
        now = _read(s, 36, within=10)
        assert len(now) == 36 and {r.code for r in now} == {ResponseCode.PULL_NOT_FOUND}
        normal.served()  # served while this connection holds its 64
        table = _runtime(cluster.broker.addr)
        assert int(table["pullNotHeldOverLimit"]) - before == 36
    normal.served()


def _queue(normal: Normal, queue_id: int):  # type: ignore[no-untyped-def]
    return next(q for q in normal.consumer.fetch_message_queues(TOPIC) if q.queue_id == queue_id)


def test_a_burst_wakes_many_held_pulls_in_slices_while_the_normal_client_is_served(
        live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    normal.served()
    queue = _queue(normal, 1)
    offset = int(normal.consumer.max_offset(queue))
    before = int(_runtime(cluster.broker.addr)["pullWakesDeferred"])
    conns = [_connect(cluster.broker.addr) for _ in range(2)]
    try:
        for i, s in enumerate(conns):
            s.sendall(_held_pulls(1, offset, 60, 1000 * (i + 1)))  # 120 held (60 per connection)
        time.sleep(0.5)
        with Producer("PG_bounds_burst", cluster.ns) as burst:
            assert burst.send(Message(TOPIC, b"wake"), queue=queue).queue.queue_id == 1
        normal.served()
        for s in conns:
            answers = _read(s, 60, within=20)
            assert len(answers) == 60 and {a.code for a in answers} == {ResponseCode.SUCCESS}
        assert int(_runtime(cluster.broker.addr)["pullWakesDeferred"]) > before  # slices of 8 per loop turn
        normal.served()
    finally:
        for s in conns:
            s.close()


def test_namesrv_kv_is_capped_while_routes_are_served(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    codes = []
    with _connect(cluster.ns) as s:
        for i in range(12):
            s.sendall(encode_frame(RemotingCommand(code=RequestCode.PUT_KV_CONFIG, opaque=i + 1, ext_fields={
                "namespace": "abuse", "key": f"k{i}", "value": "v" * 10})))
            (resp,) = _read(s, 1)
            codes.append(resp.code)
        big = RemotingCommand(code=RequestCode.PUT_KV_CONFIG, opaque=99, ext_fields={
            "namespace": "abuse", "key": "k0", "value": "v" * 1000})
        s.sendall(encode_frame(big))
        (resp,) = _read(s, 1)
    assert codes[:5] == [ResponseCode.SUCCESS] * 5 and ResponseCode.SUCCESS not in codes[5:]
    assert resp.code != ResponseCode.SUCCESS and "kv_max_value_bytes" in (resp.remark or "")
    normal.served()  # the namesrv still routes the normal client


def _raw(addr: str, cmd: RemotingCommand) -> RemotingCommand:
    with _connect(addr) as s:
        s.sendall(encode_frame(cmd))
        (resp,) = _read(s, 1)
    return resp


def test_a_huge_pull_is_answered_within_the_byte_cap(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    queue = _queue(normal, 2)
    with Producer("PG_bounds_fill", cluster.ns) as p:
        for i in range(120):  # 120 KiB on queue 2
            p.send(Message(TOPIC, bytes(1024)), queue=queue)
    start = normal.consumer.min_offset(queue)
    resp = _raw(cluster.broker.addr, RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=5, ext_fields={
        "consumerGroup": "CG_bounds_huge", "topic": TOPIC, "queueId": "2", "queueOffset": str(start),
        "maxMsgNums": str(2**31 - 1), "maxMsgBytes": str(2**31 - 1), "sysFlag": "4", "commitOffset": "0",
        "suspendTimeoutMillis": "0", "subVersion": "0", "subscription": "*", "expressionType": "TAG"}))
    assert resp.code == ResponseCode.SUCCESS and 0 < len(resp.body) <= 64 * 1024
    normal.served()


def test_new_selector_compilations_are_bounded_per_client(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    codes = []
    with _connect(cluster.broker.addr) as s:
        for i in range(16):
            s.sendall(encode_frame(RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=i + 1, ext_fields={
                "consumerGroup": "CG_bounds_sql", "topic": TOPIC, "queueId": "0", "queueOffset": "0",
                "maxMsgNums": "1", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
                "subVersion": "0", "subscription": f"a > {i} AND b < {i + 1000}", "expressionType": "SQL92"})))
            (resp,) = _read(s, 1)
            codes.append(resp.code)
    assert ResponseCode.SYSTEM_BUSY not in codes[:10] and set(codes[10:]) == {ResponseCode.SYSTEM_BUSY}
    normal.served()


def test_auto_created_topics_are_capped(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    codes = []
    for i in range(12):
        codes.append(_raw(cluster.broker.addr, RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=1, ext_fields={
            "a": "PG_bounds_auto", "b": f"AbuseAuto{i}", "c": "TBW102", "d": "4", "e": "0", "f": "0",
            "g": "0", "h": "0", "i": "", "j": "0", "k": "false"}, body=b"x")).code)
    assert ResponseCode.TOPIC_NOT_EXIST in codes and codes.count(ResponseCode.SUCCESS) < 6
    normal.served()  # an existing topic still takes sends


def test_one_bad_send_fails_alone(live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    resp = _raw(cluster.broker.addr, RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=1, ext_fields={
        "a": "PG_bounds_bad", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0",
        "h": str(2**40), "i": "", "j": "0", "k": "false"}, body=b"x"))
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "flag" in (resp.remark or "")
    normal.served()
