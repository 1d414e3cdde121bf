"""Transactional messages end to end: the SDK's TransactionProducer against real ``sluice namesrv`` /
``sluice broker`` subprocesses (a short check interval from the broker's TOML), including a producer gone,
the discard after transaction_check_max, a broker killed with SIGKILL between half and commit, and ACL."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import Cluster, running_cluster, wait_for, wait_for_route

from sluice import Credentials, LocalTransactionState, Message, PullConsumer, TransactionProducer
from sluice.errors import MessageIllegalError
from sluice.message import MessageExt
from sluice.acl.signing import remoting_client
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.msgid import decode_offset_msg_id
from sluice.transport.blocking import LoopThread

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
FAST = "transaction_check_interval_ms = 300\ntransaction_timeout_ms = 200\n"
_n = 0


def unique(prefix: str) -> str:
    global _n
    _n += 1
    return f"{prefix}{_n}_{time.monotonic_ns() % 10**8}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("tx"), config=FAST) as c:
        yield c


def delivered(ns: str, topic: str, **options: Any) -> list[MessageExt]:
    """Every message of ``topic`` from offset 0 on, through a pull consumer."""
    out: list[MessageExt] = []
    with PullConsumer(unique("CG"), ns, **options) as c:
        for mq in c.fetch_message_queues(topic):
            off = 0
            while True:
                r = c.pull(mq, "*", off)
                out += r.msg_found_list
                if r.next_begin_offset == off or not r.msg_found_list:
                    break
                off = r.next_begin_offset
    return out


class Checks:
    """A check callback answering ``state`` and counting its calls."""

    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state
        self.seen: list[MessageExt] = []
        self.lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> LocalTransactionState:
        with self.lock:
            self.seen.append(msg)
        return self.state


def test_commit_delivers_exactly_once_and_rollback_never(cluster: Cluster) -> None:
    topic = unique("TxCommit")
    with TransactionProducer(unique("PG"), namesrv=cluster.ns, execute=lambda m, arg: arg,
                             check=Checks(UNKNOW)) as p:
        r1 = p.send_in_transaction(Message(topic, b"yes", tags="A", keys="k1"), COMMIT)
        r2 = p.send_in_transaction(Message(topic, b"no"), ROLLBACK)
        assert (r1.transaction_state, r2.transaction_state) == (COMMIT, ROLLBACK)
        wait_for_route(cluster.ns, topic)
        msgs = wait_for(lambda: delivered(cluster.ns, topic), what="the committed message")
        time.sleep(1.0)  # several check intervals: nothing more may come
        msgs = delivered(cluster.ns, topic)
    assert [m.body for m in msgs] == [b"yes"]
    m = msgs[0]
    assert (m.tags, m.keys, m.msg_id, m.sysflag & 0xC) == ("A", ["k1"], r1.msg_id, 0x8)
    assert P.TRAN_MSG not in m.properties and P.REAL_TOPIC not in m.properties


def test_unknow_then_check_back_commits_once(cluster: Cluster) -> None:
    topic = unique("TxCheck")
    checks = Checks(COMMIT)
    with TransactionProducer(unique("PG"), namesrv=cluster.ns, execute=lambda m, a: UNKNOW, check=checks) as p:
        r = p.send_in_transaction(Message(topic, b"later"))
        assert r.transaction_state is UNKNOW
        wait_for_route(cluster.ns, topic)
        msgs = wait_for(lambda: delivered(cluster.ns, topic), what="the message committed by the check")
        time.sleep(1.0)
        assert [m.body for m in delivered(cluster.ns, topic)] == [b"later"]
    assert len(checks.seen) == 1 and checks.seen[0].body == b"later" and checks.seen[0].topic == topic
    assert checks.seen[0].msg_id == r.msg_id and msgs[0].msg_id == r.msg_id


def test_a_failing_local_transaction_is_left_to_the_check_and_delays_are_refused(cluster: Cluster) -> None:
    topic = unique("TxRaise")

    def boom(msg: Message, arg: Any) -> LocalTransactionState:
        raise RuntimeError("local transaction failed")
    with TransactionProducer(unique("PG"), namesrv=cluster.ns, execute=boom, check=Checks(ROLLBACK)) as p:
        assert p.send_in_transaction(Message(topic, b"x")).transaction_state is UNKNOW
        with pytest.raises(MessageIllegalError, match="cannot be delayed"):
            p.send_in_transaction(Message(topic, b"d", delay_level=2))


def test_a_producer_gone_leaves_it_pending_for_a_later_producer(cluster: Cluster) -> None:
    topic, group = unique("TxGone"), unique("PG")
    with TransactionProducer(group, namesrv=cluster.ns, execute=lambda m, a: UNKNOW, check=Checks(UNKNOW)) as p:
        p.send_in_transaction(Message(topic, b"orphan"))
    time.sleep(1.0)  # checks with no producer of the group: counted, nothing delivered
    wait_for_route(cluster.ns, topic)
    assert delivered(cluster.ns, topic) == []
    checks = Checks(COMMIT)
    with TransactionProducer(group, namesrv=cluster.ns, execute=lambda m, a: UNKNOW, check=checks):
        msgs = wait_for(lambda: delivered(cluster.ns, topic), what="commit by the later producer")
    assert [m.body for m in msgs] == [b"orphan"] and len(checks.seen) == 1


def test_discarded_after_transaction_check_max(tmp_path: Path) -> None:
    with running_cluster(tmp_path, config=FAST + "transaction_check_max = 2\n") as c:
        topic = unique("TxMax")
        checks = Checks(UNKNOW)
        with TransactionProducer(unique("PG"), namesrv=c.ns, execute=lambda m, a: UNKNOW, check=checks) as p:
            p.send_in_transaction(Message(topic, b"undecided"))
            wait_for_route(c.ns, "TRANS_CHECK_MAX_TIME_TOPIC", timeout=20)
            kept = wait_for(lambda: delivered(c.ns, "TRANS_CHECK_MAX_TIME_TOPIC"), what="the discarded half")
            time.sleep(1.0)
            assert len(checks.seen) == 2  # transaction_check_max checks, then no more
        assert [m.body for m in kept] == [b"undecided"] and kept[0].properties[P.REAL_TOPIC] == topic
        assert delivered(c.ns, topic) == []


def test_a_killed_broker_keeps_the_half_pending_and_recoverable(tmp_path: Path) -> None:
    """SIGKILL while two local transactions run: the one committed after the restart is delivered once;
    the one left UNKNOW stays undecided until a producer of its group answers the check."""
    with running_cluster(tmp_path, config=FAST) as c:
        topic, group = unique("TxKill"), unique("PG")
        held = threading.Semaphore(0)
        go_on = threading.Event()

        def execute(msg: Message, arg: Any) -> LocalTransactionState:
            held.release()
            go_on.wait(30)  # the broker is killed while the local transaction runs
            return arg
        with TransactionProducer(group, namesrv=c.ns, execute=execute, check=Checks(UNKNOW)) as p:
            senders = [threading.Thread(target=p.send_in_transaction, args=(Message(topic, body), state))
                       for body, state in ((b"committed", COMMIT), (b"undecided", UNKNOW))]
            for t in senders:
                t.start()
            assert held.acquire(timeout=30) and held.acquire(timeout=30)
            c.restart_broker(kill=True)
            go_on.set()  # END_TRANSACTION reaches the restarted broker
            for t in senders:
                t.join(30)
            wait_for_route(c.ns, topic, timeout=20)
            assert [m.body for m in wait_for(lambda: delivered(c.ns, topic), what="commit after restart")] == \
                [b"committed"]
        time.sleep(1.0)  # checks find no producer of the group: still undecided
        assert [m.body for m in delivered(c.ns, topic)] == [b"committed"]
        checks = Checks(COMMIT)
        with TransactionProducer(group, namesrv=c.ns, execute=lambda m, a: UNKNOW, check=checks):
            wait_for(lambda: len(delivered(c.ns, topic)) == 2, what="commit by the check after the crash")
            time.sleep(1.0)
            assert sorted(m.body for m in delivered(c.ns, topic)) == [b"committed", b"undecided"]
        assert [m.body for m in checks.seen] == [b"undecided"]


ACL = """\
accounts:
  - accessKey: txuser
    secretKey: tx-secret-1
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TxAcl=PUB|SUB
      - TBW102=PUB|SUB
  - accessKey: txsub
    secretKey: tx-secret-2
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TxAcl=SUB
      - TxOther=PUB
"""


def test_acl_end_transaction_needs_pub_on_the_real_topic(tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    user = Credentials("txuser", "tx-secret-1")
    with running_cluster(tmp_path, ("broker-a",), "--acl", str(tmp_path / "plain_acl.yml"), config=FAST) as c:
        with TransactionProducer("PG_tx_acl", namesrv=c.ns, execute=lambda m, a: COMMIT, check=Checks(UNKNOW),
                                 credentials=user) as p:
            assert p.send_in_transaction(Message("TxAcl", b"signed")).transaction_state is COMMIT
            wait_for_route(c.ns, "TxAcl")
            msgs = wait_for(lambda: delivered(c.ns, "TxAcl", credentials=user), what="commit under ACL")
            assert [m.body for m in msgs] == [b"signed"]
            p._impl.execute = lambda m, a: UNKNOW
            r = p.send_in_transaction(Message("TxAcl", b"second"))
            addr = c.broker.addr
            fields = {"producerGroup": "PG_tx_acl", "tranStateTableOffset": r.queue_offset,
                      "commitLogOffset": decode_offset_msg_id(r.offset_msg_id).offset, "commitOrRollback": 8,
                      "fromTransactionCheck": "false", "msgId": r.msg_id}
            loop = LoopThread("acl-tx")
            try:
                sub = Credentials("txsub", "tx-secret-2")
                # SUB only on the real topic: refused, whether or not the header names (another) topic.
                for who, extra, code in ((sub, {}, ResponseCode.NO_PERMISSION),
                                         (sub, {"topic": "TxOther"}, ResponseCode.NO_PERMISSION),
                                         (user, {}, ResponseCode.SUCCESS)):
                    client = remoting_client(who)
                    resp = loop.run(client.invoke(addr, RemotingCommand.request(RequestCode.END_TRANSACTION,
                                                                                {**fields, **extra}), 5), 10)
                    loop.run(client.close(), 10)
                    assert resp.code == code, resp.remark
            finally:
                loop.stop()
            msgs = wait_for(lambda: len(got := delivered(c.ns, "TxAcl", credentials=user)) == 2 and got,
                            what="the second commit")
        assert sorted(m.body for m in msgs) == [b"second", b"signed"]


def test_async_producer_with_coroutine_callbacks(cluster: Cluster) -> None:
    from sluice.client import AsyncTransactionProducer

    topic = unique("TxAsync")
    seen: list[bytes] = []

    async def execute(msg: Message, arg: Any) -> LocalTransactionState:
        return UNKNOW

    async def check(msg: MessageExt) -> LocalTransactionState:
        seen.append(msg.body)
        return COMMIT

    async def run() -> LocalTransactionState:
        async with AsyncTransactionProducer(unique("PG"), cluster.ns, execute=execute, check=check) as p:
            r = await p.send_in_transaction(Message(topic, b"async"))
            for _ in range(200):  # the check comes within a few intervals
                if seen:
                    break
                await asyncio.sleep(0.05)
            return r.transaction_state
    assert asyncio.run(run()) is UNKNOW
    wait_for_route(cluster.ns, topic)
    assert [m.body for m in wait_for(lambda: delivered(cluster.ns, topic), what="async commit")] == [b"async"]
    assert seen == [b"async"]
