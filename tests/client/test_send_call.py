"""SendCall, the callback-driven send loop (client/send_call.py), against a scripted remoting client: which
attempts it makes, what it charges the fault strategy, and what reaches the caller's future."""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice.client.encoding import prepare_message
from sluice.client.fault import MQFaultStrategy
from sluice.client.options import ProducerOptions
from sluice.client.results import MessageQueue, SendResult, SendStatus
from sluice.client.routing import TopicPublishInfo
from sluice.client.send_call import SendCall
from sluice.errors import ClientError, MessageIllegalError, RemotingError, RemotingTimeoutError, SluiceError
from sluice.message import Message
from sluice.protocol.bodies import BrokerData, QueueData, TopicRouteData
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand

TOPIC = "T"
BROKERS = {"broker-a": "10.0.0.1:10911", "broker-b": "10.0.0.2:10911"}
Outcome = Callable[[RemotingCommand], RemotingCommand | BaseException]


def ok(req: RemotingCommand, code: int = ResponseCode.SUCCESS) -> RemotingCommand:
    return req.make_response(code, ext_fields={"msgId": "0A0000010000" + "0" * 20, "queueId": req.ext_fields["e"],
                                               "queueOffset": "7"})


def refused(code: int) -> Outcome:
    return lambda req: req.make_response(code, remark=f"refused with {code}")


@dataclass
class FakeRemoting:
    """Answers each request with the next scripted outcome, one loop iteration later, as a connection would;
    ``connected`` says which addresses have an open connection (the others go through ``invoke``)."""

    script: list[Outcome]
    connected: set[str] = field(default_factory=lambda: set(BROKERS.values()))
    sent: list[tuple[str, RemotingCommand, str]] = field(default_factory=list)  # (addr, request, path)
    loop: Any = None

    def _answer(self, addr: str, req: RemotingCommand, path: str) -> RemotingCommand | BaseException:
        self.sent.append((addr, req, path))
        return self.script.pop(0)(req)

    def open_connection(self, addr: str) -> str | None:
        return addr if addr in self.connected else None

    def request_with(self, conn: str, req: RemotingCommand, timeout: float, waiter: Any) -> int:
        outcome = self._answer(conn, req, "fast")
        if isinstance(outcome, BaseException):
            asyncio.get_running_loop().call_soon(waiter.set_exception, outcome)
        else:
            asyncio.get_running_loop().call_soon(waiter.set_result, outcome)
        return len(self.sent)

    def request_from_thread(self, addr: str, req: RemotingCommand, timeout: float, waiter: Any) -> bool:
        """As RemotingClient's: written from the caller's thread (False when ``addr`` has no open connection),
        answered on the loop thread (``loop``, set by the test)."""
        if addr not in self.connected:
            return False
        outcome = self._answer(addr, req, "thread")
        how = waiter.set_exception if isinstance(outcome, BaseException) else waiter.set_result
        self.loop.call_soon_threadsafe(how, outcome)
        return True

    async def invoke(self, addr: str, req: RemotingCommand, timeout: float) -> RemotingCommand:
        await asyncio.sleep(0)
        outcome = self._answer(addr, req, "invoke")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def invoke_oneway(self, addr: str, req: RemotingCommand) -> None:
        self._answer(addr, req, "oneway")


class FakeInstance:
    def __init__(self, remoting: FakeRemoting) -> None:
        self.remoting = remoting

    def find_broker_addr(self, name: str) -> str | None:
        return BROKERS.get(name)


class FakeProducer:
    group = "PG"

    def __init__(self, script: list[Outcome], *, routed: bool = True, **options: Any) -> None:
        self.options = ProducerOptions(**options)
        self.fault = MQFaultStrategy(self.options.send_latency_fault_enable)
        self.remoting = FakeRemoting(script)
        self.instance = FakeInstance(self.remoting)
        route = TopicRouteData(
            queue_datas=[QueueData(broker_name=b, read_queue_nums=2, write_queue_nums=2, perm=6) for b in BROKERS],
            broker_datas=[BrokerData(cluster="c", broker_name=b, broker_addrs={0: a}) for b, a in BROKERS.items()])
        self.info = TopicPublishInfo(TOPIC, route, start_index=0)
        self.routed = routed
        self.charged: list[tuple[str, bool]] = []
        update = self.fault.update_fault_item

        def charge(name: str, latency: float, isolation: bool) -> None:
            self.charged.append((name, isolation))
            update(name, latency, isolation)
        self.fault.update_fault_item = charge  # type: ignore[method-assign]

    def publish_info_now(self, topic: str) -> TopicPublishInfo | None:
        return self.info if self.routed else None

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        await asyncio.sleep(0)
        return self.info


def send(producer: FakeProducer, *, cf: bool = False, **kw: Any) -> SendResult | None:
    """Run one SendCall to its end on a fresh loop; its outcome (raised if an error)."""
    async def main() -> Any:
        msg = Message(TOPIC, b"body")
        fut: Any = concurrent.futures.Future() if cf else asyncio.get_running_loop().create_future()
        SendCall(producer, prepare_message(msg), msg, fut, timeout=kw.pop("timeout", 3.0), **kw).start()  # type: ignore[arg-type]
        if cf:
            while not fut.done():
                await asyncio.sleep(0.001)
            return fut.result()
        return await fut
    return asyncio.run(main())


def brokers(p: FakeProducer) -> list[str]:
    return [req.ext_fields["n"] for _, req, _ in p.remoting.sent]


def test_a_retriable_refusal_is_retried_on_another_broker() -> None:
    p = FakeProducer([refused(ResponseCode.SYSTEM_BUSY), ok])
    result = send(p)
    assert result is not None and result.status is SendStatus.SEND_OK and result.queue.broker_name == "broker-b"
    assert brokers(p) == ["broker-a", "broker-b"]
    assert p.charged == [("broker-a", False), ("broker-b", False)]
    assert [path for *_, path in p.remoting.sent] == ["fast", "fast"]


def test_a_network_failure_charges_the_isolation_and_is_retried() -> None:
    p = FakeProducer([lambda req: RemotingTimeoutError("no response"), ok])
    assert send(p, cf=True).queue.broker_name == "broker-b"  # type: ignore[union-attr]
    assert p.charged == [("broker-a", True), ("broker-b", False)]


def test_a_final_refusal_raises_at_once() -> None:
    p = FakeProducer([refused(ResponseCode.MESSAGE_ILLEGAL), ok])
    with pytest.raises(SluiceError, match="refused with"):
        send(p)
    assert brokers(p) == ["broker-a"]


def test_every_attempt_failing_raises_the_last_error_naming_the_queues_tried() -> None:
    p = FakeProducer([refused(ResponseCode.SYSTEM_BUSY)] * 3)
    with pytest.raises(SluiceError) as info:
        send(p)
    assert brokers(p) == ["broker-a", "broker-b", "broker-a"]
    assert any("failed after 3 attempt(s)" in n and "broker-b/" in n for n in info.value.__notes__)


def test_retry_times_bounds_the_attempts() -> None:
    p = FakeProducer([refused(ResponseCode.SYSTEM_BUSY)] * 5, retry_times=0)
    with pytest.raises(SluiceError):
        send(p)
    assert len(p.remoting.sent) == 1


@pytest.mark.parametrize("retry", [False, True])
def test_stored_but_not_send_ok(retry: bool) -> None:
    flush_timeout: Outcome = lambda req: ok(req, ResponseCode.FLUSH_DISK_TIMEOUT)  # noqa: E731
    p = FakeProducer([flush_timeout, flush_timeout, flush_timeout],
                     retry_another_broker_when_not_store_ok=retry)
    result = send(p)
    assert result is not None and result.status is SendStatus.FLUSH_DISK_TIMEOUT
    assert len(p.remoting.sent) == (3 if retry else 1)


def test_ordered_sends_make_one_attempt_and_raise_as_is() -> None:
    p = FakeProducer([lambda req: RemotingError("gone"), ok])
    queue = MessageQueue(topic=TOPIC, broker_name="broker-b", queue_id=1)
    with pytest.raises(RemotingError, match="gone") as info:
        send(p, queue=queue)
    assert not getattr(info.value, "__notes__", None)
    assert brokers(p) == ["broker-b"] and p.charged == []
    p = FakeProducer([ok])
    picked = send(p, selector=lambda queues, msg, arg: queues[arg], arg=3)
    assert picked is not None and (picked.queue.broker_name, picked.queue.queue_id) == ("broker-b", 1)


def test_a_selector_returning_something_else_fails_the_send() -> None:
    p = FakeProducer([ok])
    with pytest.raises(ClientError, match="not a MessageQueue"):
        send(p, selector=lambda queues, msg, arg: "q0")
    assert p.remoting.sent == []


def test_without_a_cached_route_or_an_open_connection_it_waits_in_a_task() -> None:
    p = FakeProducer([lambda req: RemotingError("refused"), ok], routed=False)
    p.remoting.connected = {BROKERS["broker-b"]}
    assert send(p).queue.broker_name == "broker-b"  # type: ignore[union-attr]
    assert [path for *_, path in p.remoting.sent] == ["invoke", "fast"]


def test_oneway_makes_one_attempt_and_returns_none() -> None:
    p = FakeProducer([ok])
    assert send(p, oneway=True) is None
    assert [path for *_, path in p.remoting.sent] == ["oneway"]


def test_bad_timeout_and_unexpected_errors_reach_the_future() -> None:
    with pytest.raises(Exception, match="timeout must be positive"):
        send(FakeProducer([ok]), timeout=0)

    def bug(req: RemotingCommand) -> RemotingCommand:
        return RemotingCommand.request(0)  # a "response" without the header fields: parsing fails
    with pytest.raises(SluiceError):
        send(FakeProducer([bug]))


def test_a_cancelled_future_starts_no_further_attempt() -> None:
    p = FakeProducer([refused(ResponseCode.SYSTEM_BUSY), ok, ok])

    async def main() -> None:
        msg = Message(TOPIC, b"body")
        fut = asyncio.get_running_loop().create_future()
        SendCall(p, prepare_message(msg), msg, fut, timeout=3.0).start()  # type: ignore[arg-type]
        fut.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
    asyncio.run(main())
    assert len(p.remoting.sent) == 1


def test_an_invalid_message_never_reaches_the_wire() -> None:
    from sluice.client.send_call import settle
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    settle(fut, None, MessageIllegalError("message body is empty"))
    with pytest.raises(MessageIllegalError):
        fut.result(0)
    cancelled: concurrent.futures.Future[Any] = concurrent.futures.Future()
    cancelled.cancel()
    settle(cancelled, 1, None)  # an owner's cancel wins; nothing raises
    assert cancelled.cancelled()


def send_from_thread(producer: FakeProducer, msg: Message | None = None, **kw: Any) -> tuple[bool, Any]:
    """SendCall.start_from_thread on a thread other than the running loop's: whether it wrote, and the future's
    outcome (the exception when it failed; None when nothing was sent)."""
    async def main() -> tuple[bool, Any]:
        loop = asyncio.get_running_loop()
        producer.remoting.loop = loop
        m = msg or Message(TOPIC, b"body")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        call = SendCall(producer, prepare_message(m), m, fut, timeout=3.0, **kw)  # type: ignore[arg-type]
        wrote = await loop.run_in_executor(None, call.start_from_thread, loop)
        if not wrote:
            return False, None
        return True, await asyncio.wrap_future(fut)
    try:
        return asyncio.run(main())
    except SluiceError as exc:
        return True, exc


def test_the_first_attempt_leaves_from_the_callers_thread_and_its_answer_settles_the_future() -> None:
    p = FakeProducer([ok])
    wrote, result = send_from_thread(p)
    assert wrote and isinstance(result, SendResult) and result.status is SendStatus.SEND_OK
    assert [path for *_, path in p.remoting.sent] == ["thread"] and p.charged == [("broker-a", False)]


def test_a_thread_written_attempt_refused_is_retried_from_the_loop_on_another_broker() -> None:
    p = FakeProducer([refused(ResponseCode.SYSTEM_BUSY), ok])
    wrote, result = send_from_thread(p)
    assert wrote and isinstance(result, SendResult)
    assert [path for *_, path in p.remoting.sent] == ["thread", "fast"] and brokers(p) == ["broker-a", "broker-b"]


@pytest.mark.parametrize("case", ["ordered", "fault", "unrouted", "unconnected", "oneway"])
def test_sends_that_need_the_loop_write_nothing_from_a_thread(case: str) -> None:
    kw: dict[str, Any] = {}
    options: dict[str, Any] = {}
    if case == "ordered":
        kw["queue"] = MessageQueue(topic=TOPIC, broker_name="broker-a", queue_id=0)
    if case == "oneway":
        kw["oneway"] = True
    if case == "fault":
        options["send_latency_fault_enable"] = True
    p = FakeProducer([ok], routed=case != "unrouted", **options)
    if case == "unconnected":
        p.remoting.connected = set()
    wrote, result = send_from_thread(p, **kw)
    assert not wrote and result is None and p.remoting.sent == []
