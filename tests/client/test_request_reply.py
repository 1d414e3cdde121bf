"""Request-reply end to end against real ``sluice namesrv`` / ``sluice broker`` subprocesses: a requester's
``Producer.request`` gets the reply a push consumer sent with ``sluice.reply_to`` (SEND_REPLY_MESSAGE_V2 stored
and pushed back with PUSH_REPLY_MESSAGE_TO_CLIENT), a request nobody answers times out naming its correlation
id, and two requesters each get their own replies; plus the pure parts (reply_to, the push decoding)."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from servers import Cluster, running_cluster, wait_for_route

import sluice
from sluice import ConsumeResult, Message, Producer, PullConsumer, PushConsumer
from sluice.client.instance import ClientInstance
from sluice.client.reply import ReplyMessage, ReplyWaiters, reply_from_push
from sluice.errors import ClientError, RequestTimeoutError
from sluice.client.results import MessageQueue
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import ReplyMessageRequestHeader

_n = 0


def unique(prefix: str) -> str:
    global _n
    _n += 1
    return f"{prefix}{_n}_{time.monotonic_ns() % 10**8}"


def _request_ext(props: dict[str, str]) -> MessageExt:
    return MessageExt(topic="T", body=b"q", properties=props, queue_id=0, queue_offset=0, commitlog_offset=0,
                      msg_id="", offset_msg_id="", sysflag=0, flag=0, born_timestamp=0, born_host=("", 0),
                      store_timestamp=0, store_host=("", 0), reconsume_times=0, body_crc=0, store_size=0)


# ------------------------------------------------------------------------------------------------ pure parts

def test_reply_to_follows_create_reply_message() -> None:
    req = _request_ext({P.CLUSTER: "C1", P.CORRELATION_ID: "cid", P.REPLY_TO_CLIENT: "1.2.3.4@9#1", P.TTL: "3000",
                        P.UNIQ_KEY: "U"})
    reply = sluice.reply_to(req, b"answer")
    assert isinstance(reply, ReplyMessage)
    assert reply.topic == "C1_REPLY_TOPIC" and reply.body == b"answer"
    assert reply.reply_properties == {P.MSG_TYPE: "reply", P.CORRELATION_ID: "cid",
                                      P.REPLY_TO_CLIENT: "1.2.3.4@9#1", P.TTL: "3000"}
    assert reply.properties == {}  # the routing properties never pass as user properties


def test_reply_to_refuses_a_message_that_was_not_a_request() -> None:
    with pytest.raises(ClientError, match=r"property\[CLUSTER\] is null") as info:
        sluice.reply_to(_request_ext({P.UNIQ_KEY: "U"}), b"x")
    assert info.value.code == 10007


def test_push_decodes_as_receive_reply_message() -> None:
    import zlib
    header = ReplyMessageRequestHeader(producer_group="PG", topic="C_REPLY_TOPIC", queue_id=0, sys_flag=0x1,
                                       born_timestamp=5, flag=3,
                                       properties=P.encode_properties({P.CORRELATION_ID: "c", P.UNIQ_KEY: "u"}),
                                       born_host="/10.0.0.1:4000", store_host="/10.0.0.2:10911", store_timestamp=9)
    cmd = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, header.to_ext(), zlib.compress(b"big"))
    msg = reply_from_push(cmd, 77)
    assert msg.body == b"big" and msg.sysflag == 0 and msg.flag == 3 and msg.born_timestamp == 5
    assert msg.born_host == ("10.0.0.1", 4000) and msg.store_host == ("10.0.0.2", 10911)
    assert msg.properties[P.ARRIVE_TIME] == "77" and msg.msg_id == "u"


def test_waiters_complete_only_the_matching_request() -> None:
    class FakeRemoting:
        def register(self, code: int, handler: object) -> None:
            self.handler = handler

    class FakeInst:
        remoting = FakeRemoting()
        service = ClientInstance.service  # the per-instance service table, as a ClientInstance keeps it

        def __init__(self) -> None:
            self._services: dict[type, object] = {}

    async def main() -> None:
        inst = FakeInst()
        w = ReplyWaiters.of(inst)
        assert ReplyWaiters.of(inst) is w
        a, b = w.expect("a"), w.expect("b")
        header = ReplyMessageRequestHeader(producer_group="PG", topic="T", queue_id=0,
                                           properties=P.encode_properties({P.CORRELATION_ID: "b"}),
                                           born_host="/1.1.1.1:1", store_host="/2.2.2.2:2", store_timestamp=1)
        cmd = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, header.to_ext(), b"r")

        class Conn:
            peer = "x:1"
        resp = await inst.remoting.handler(Conn(), cmd)
        assert resp.code == 0 and b.done() and not a.done() and b.result().body == b"r"
        resp = await inst.remoting.handler(Conn(), cmd)  # nobody waits for "b" now
        assert resp.code == 0 and w.unmatched == 1
    asyncio.run(main())


# ------------------------------------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("reqreply")) as c:
        yield c


class Replier:
    """A push consumer answering each request with ``b"re:" + body`` through a producer of its own."""

    def __init__(self, ns: str, topic: str) -> None:
        self.producer = Producer(unique("RPG"), ns)
        self.consumer = PushConsumer(unique("RCG"), ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        self.consumer.subscribe(topic, "*")
        self.consumer.register_listener(self.on_messages)
        self.seen: list[MessageExt] = []
        self.lock = threading.Lock()

    def on_messages(self, msgs: list[MessageExt]) -> ConsumeResult:
        for m in msgs:
            with self.lock:
                self.seen.append(m)
            self.producer.send(sluice.reply_to(m, b"re:" + m.body))
        return ConsumeResult.SUCCESS

    def __enter__(self) -> Replier:
        self.producer.start()
        self.consumer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.shutdown()
        self.producer.shutdown()


def _create_topic(cluster: Cluster, topic: str) -> None:
    with Producer(unique("SETUP"), cluster.ns) as p:  # auto-created by a first send, then routed
        p.send(Message(topic, b"warm-up"))
    wait_for_route(cluster.ns, topic)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_request_returns_the_reply_and_the_reply_is_stored(cluster: Cluster) -> None:
    topic = unique("Req")
    _create_topic(cluster, topic)
    with Replier(cluster.ns, topic) as replier, Producer(unique("QPG"), cluster.ns) as requester:
        reply = requester.request(Message(topic, b"ping", tags="Q"), timeout=15.0)
        assert reply.body == b"re:ping"
        assert reply.topic == "DefaultCluster_REPLY_TOPIC"
        assert reply.properties[P.MSG_TYPE] == "reply"
        assert reply.properties[P.REPLY_TO_CLIENT] == requester.async_producer.instance.client_id
        assert P.PUSH_REPLY_TIME in reply.properties and P.ARRIVE_TIME in reply.properties
        request = next(m for m in replier.seen if m.body == b"ping")
        assert request.properties[P.CORRELATION_ID] == reply.properties[P.CORRELATION_ID]
        assert request.properties[P.CLUSTER] == "DefaultCluster"
        assert request.properties[P.TTL] == "15000"
    # storeReplyMessageEnable: the reply is in the reply topic too, with its routing properties.
    with PullConsumer(unique("CHK"), cluster.ns) as c:
        (mq,) = c.fetch_message_queues("DefaultCluster_REPLY_TOPIC")
        stored = c.pull(mq, "*", 0).msg_found_list
    assert [m.properties[P.CORRELATION_ID] for m in stored if m.body == b"re:ping"] == \
        [reply.properties[P.CORRELATION_ID]]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_request_without_a_replier_times_out_naming_the_correlation_id(cluster: Cluster) -> None:
    topic = unique("ReqNone")
    _create_topic(cluster, topic)
    with Producer(unique("QPG"), cluster.ns) as requester:
        with pytest.raises(RequestTimeoutError) as info:
            requester.request(Message(topic, b"nobody"), timeout=1.0)
    err = info.value
    assert err.correlation_id and err.correlation_id in str(err) and err.code == 10006
    assert isinstance(err, sluice.SluiceError)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_two_requesters_each_get_their_own_replies(cluster: Cluster) -> None:
    topic = unique("ReqTwo")
    _create_topic(cluster, topic)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def ask(name: str, requester: Producer) -> None:
        try:
            for i in range(5):
                got[name].append(requester.request(Message(topic, f"{name}{i}".encode()), timeout=15.0).body)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    # Separate client instances: each requester has its own client id and connection.
    with Replier(cluster.ns, topic), Producer(unique("QA"), cluster.ns, instance_name="req-a") as a, \
            Producer(unique("QB"), cluster.ns, instance_name="req-b") as b:
        assert a.async_producer.instance.client_id != b.async_producer.instance.client_id
        threads = [threading.Thread(target=ask, args=("a", a)), threading.Thread(target=ask, args=("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert got == {"a": [f"re:a{i}".encode() for i in range(5)], "b": [f"re:b{i}".encode() for i in range(5)]}


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_reply_to_a_gone_requester_is_refused_by_name(cluster: Cluster) -> None:
    req = _request_ext({P.CLUSTER: "DefaultCluster", P.CORRELATION_ID: "c", P.REPLY_TO_CLIENT: "9.9.9.9@gone#1",
                        P.TTL: "1000"})
    with Producer(unique("RPG"), cluster.ns, retry_times=0) as p:
        with pytest.raises(sluice.SluiceError, match="channel of <9.9.9.9@gone#1> not found"):
            p.send(sluice.reply_to(req, b"late"))


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_async_producer_requests_too(cluster: Cluster) -> None:
    from sluice import AsyncProducer
    topic = unique("ReqAsync")
    _create_topic(cluster, topic)

    async def main() -> tuple[list[bytes], str]:
        async with AsyncProducer(unique("QPG"), cluster.ns, instance_name="async-req") as p:
            replies = await asyncio.gather(*(p.request(Message(topic, f"x{i}".encode()), timeout=15.0)
                                             for i in range(3)))
            with pytest.raises(RequestTimeoutError):
                await p.request(Message(topic + "Nobody", b"unanswered"), timeout=0.5)
            return [r.body for r in replies], p.instance.client_id

    with Replier(cluster.ns, topic):
        got, client_id = asyncio.run(main())
    assert got == [b"re:x0", b"re:x1", b"re:x2"]
    assert client_id


# ------------------------------------------------------------------------------------------------ the other forms

def _queued_topic(cluster: Cluster, queues: int = 4) -> str:
    topic = unique("ReqForms")  # auto-created by a first send, with ``queues`` queues
    with Producer(unique("SETUP"), cluster.ns, default_topic_queue_nums=queues) as p:
        p.send(Message(topic, b"warm-up"))
        wait_for_route(cluster.ns, topic)
        assert len(p.fetch_publish_queues(topic)) == queues
    return topic


def _last_queue(queues: list, msg: Message, arg: object) -> object:
    return queues[int(arg)]  # type: ignore[call-overload]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_request_with_a_selector_or_a_queue_goes_to_that_queue(cluster: Cluster) -> None:
    topic = _queued_topic(cluster)
    with Replier(cluster.ns, topic) as replier, Producer(unique("QPG"), cluster.ns) as requester:
        queues = requester.fetch_publish_queues(topic)
        assert requester.request(Message(topic, b"sel"), 15.0, selector=_last_queue, arg=3).body == b"re:sel"
        assert requester.request(Message(topic, b"mq"), 15.0, queue=queues[2]).body == b"re:mq"
    by_body = {m.body: m.queue_id for m in replier.seen}
    assert (by_body[b"sel"], by_body[b"mq"]) == (3, 2)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_request_callback_forms_get_the_reply_or_the_timeout(cluster: Cluster) -> None:
    topic = _queued_topic(cluster)
    silent = _queued_topic(cluster)  # a topic nobody consumes: its requests are stored, never answered
    outcomes: dict[str, tuple[MessageExt | None, BaseException | None]] = {}
    done = threading.Event()

    def on(name: str):  # type: ignore[no-untyped-def]
        def callback(reply: MessageExt | None, error: BaseException | None) -> None:
            outcomes[name] = (reply, error)
            if len(outcomes) == 4:
                done.set()
        return callback

    with Replier(cluster.ns, topic) as replier, Producer(unique("QPG"), cluster.ns) as requester:
        queues = requester.fetch_publish_queues(topic)
        futures = [requester.request_async(Message(topic, b"cb"), 15.0, callback=on("plain")),
                   requester.request_async(Message(topic, b"cb-sel"), 15.0, selector=_last_queue, arg=1,
                                           callback=on("selector")),
                   requester.request_async(Message(topic, b"cb-mq"), 15.0, queue=queues[0], callback=on("queue")),
                   requester.request_async(Message(silent, b"unanswered"), 1.0,
                                           queue=requester.fetch_publish_queues(silent)[3], callback=on("silent"))]
        assert done.wait(60), outcomes
        assert [f.result(5).body for f in futures[:3]] == [b"re:cb", b"re:cb-sel", b"re:cb-mq"]
        with pytest.raises(RequestTimeoutError):
            futures[3].result(5)
    assert {k: (r.body if r else None, e) for k, (r, e) in outcomes.items() if k != "silent"} == {
        "plain": (b"re:cb", None), "selector": (b"re:cb-sel", None), "queue": (b"re:cb-mq", None)}
    reply, error = outcomes["silent"]
    assert reply is None and isinstance(error, RequestTimeoutError)
    assert error.correlation_id and error.correlation_id in str(error) and f"<{silent}>" in str(error)
    by_body = {m.body: m.queue_id for m in replier.seen}
    assert (by_body[b"cb-sel"], by_body[b"cb-mq"]) == (1, 0)
    # The unanswered request was stored on the queue asked for, with the correlation id the error named.
    with PullConsumer(unique("CHK"), cluster.ns) as c:
        (mq,) = [q for q in c.fetch_message_queues(silent) if q.queue_id == 3]
        stored = [m for m in c.pull(mq, "*", 0).msg_found_list if m.body == b"unanswered"]
    assert [m.properties[P.CORRELATION_ID] for m in stored] == [error.correlation_id]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_async_producer_request_forms(cluster: Cluster) -> None:
    from sluice import AsyncProducer
    topic = _queued_topic(cluster)

    async def main() -> tuple[list[bytes], list[tuple[bytes | None, str | None]]]:
        got: list[tuple[bytes | None, str | None]] = []
        async with AsyncProducer(unique("QPG"), cluster.ns, instance_name="async-forms") as p:
            queues = await p.fetch_publish_queues(topic)
            sel = await p.request(Message(topic, b"a-sel"), 15.0, selector=_last_queue, arg=2)
            task = p.request_async(Message(topic, b"a-cb"), 15.0, queue=queues[3],
                                   callback=lambda r, e: got.append((r.body if r else None, type(e).__name__ if e
                                                                     else None)))
            nobody = p.request_async(Message(topic + "Nobody", b"n"), 0.5,
                                     callback=lambda r, e: got.append((None, type(e).__name__)))
            reply = await task
            with pytest.raises(RequestTimeoutError):
                await nobody
            return [sel.body, reply.body], got

    with Replier(cluster.ns, topic) as replier:
        bodies, got = asyncio.run(main())
    assert bodies == [b"re:a-sel", b"re:a-cb"]
    assert sorted(got, key=str) == sorted([(b"re:a-cb", None), (None, "RequestTimeoutError")], key=str)
    by_body = {m.body: m.queue_id for m in replier.seen}
    assert (by_body[b"a-sel"], by_body[b"a-cb"]) == (2, 3)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_request_arguments_are_refused_before_sending(cluster: Cluster) -> None:
    from sluice.errors import InvalidParameterError
    p = Producer(unique("QPG"), cluster.ns)
    with pytest.raises(ClientError, match="not started"):
        p.request_async(Message("T", b"x"))
    with p:
        with pytest.raises(InvalidParameterError, match="timeout must be positive, got 0"):
            p.request_async(Message("T", b"x"), 0)
        with pytest.raises(InvalidParameterError, match="request takes a sluice.Message, not bytes"):
            p.request_async(b"x")  # type: ignore[arg-type]
        with pytest.raises(InvalidParameterError, match="timeout must be positive, got -1"):
            p.request(Message("T", b"x"), -1)
        # What only the send finds out goes to the callback and the future: here a queue of another topic.
        topic = _queued_topic(cluster)
        errors: list[BaseException | None] = []
        other = MessageQueue(topic="Other", broker_name="broker-a", queue_id=0)
        fut = p.request_async(Message(topic, b"x"), 5.0, queue=other, callback=lambda r, e: errors.append(e))
        with pytest.raises(InvalidParameterError, match=f"is not a queue of topic '{topic}'"):
            fut.result(30)
        assert len(errors) == 1 and isinstance(errors[0], InvalidParameterError)
