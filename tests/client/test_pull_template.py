"""The push consumer's PULL_MESSAGE fields from a per-queue template (client/push_requests.py PullTemplate) against
the header dataclass's to_ext, the general road: equal, in the same order, for any field values, and the consumer
rebuilds its template when the subscription or the queue's pull task changes. No server: a recording fake."""
from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sluice.client import ConsumeResult, MessageSelector
from sluice.client.process_queue import ProcessQueue
from sluice.client.push_consumer import AsyncPushConsumer
from sluice.client.push_requests import PullTemplate
from sluice.client.results import MessageQueue
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand

ints = st.integers(min_value=0, max_value=2**63 - 1)
names = st.text(min_size=1, max_size=20)


@given(group=names, topic=names, queue_id=st.integers(0, 1 << 20), expression=st.none() | st.text(max_size=30),
       etype=st.none() | st.sampled_from(["TAG", "SQL92"]), sub_version=ints, suspend=ints,
       scan=st.none() | ints, fixed=st.tuples(ints, ints, ints, ints), per_pull=st.tuples(ints, ints, ints, ints))
def test_template_fields_equal_to_ext(group: str, topic: str, queue_id: int, expression: str | None,
                                      etype: str | None, sub_version: int, suspend: int, scan: int | None,
                                      fixed: tuple[int, int, int, int], per_pull: tuple[int, int, int, int]) -> None:
    header = H.PullMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=fixed[0], max_msg_nums=fixed[1],
        sys_flag=fixed[2], commit_offset=fixed[3], suspend_timeout_millis=suspend, subscription=expression,
        sub_version=sub_version, expression_type=etype, max_scan_units=scan)
    got = PullTemplate(header, None).ext(*per_pull)
    offset, size, flags, commit = per_pull
    want = dataclasses.replace(header, queue_offset=offset, max_msg_nums=size, sys_flag=flags,
                               commit_offset=commit).to_ext()
    assert list(got.items()) == list(want.items())


def test_a_template_is_not_changed_by_the_pulls_it_serves() -> None:
    header = H.PullMessageRequestHeader(consumer_group="G", topic="T", queue_id=0, queue_offset=0, max_msg_nums=0,
                                        sys_flag=0, commit_offset=0, suspend_timeout_millis=1, sub_version=2)
    t = PullTemplate(header, None)
    first = t.ext(5, 6, 7, 8)
    first["topic"] = "changed"
    assert t.ext(1, 2, 3, 4) == dataclasses.replace(header, queue_offset=1, max_msg_nums=2, sys_flag=3,
                                                    commit_offset=4).to_ext()


MQ = MessageQueue(topic="T", broker_name="b", queue_id=3)


def run_pulls(steps: list[Any]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Each step is a pull (offset, size, committed offset) or a callable changing the consumer; per pull, the
    extFields sent and the general road's for the consumer's state then."""
    c = AsyncPushConsumer("G", "127.0.0.1:1")
    c.subscribe("T", MessageSelector.by_sql("a > 1"))
    c.register_listener(lambda msgs: ConsumeResult.SUCCESS)
    seen: list[RemotingCommand] = []

    async def invoke(addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        assert addr == "addr" and request.code == RequestCode.PULL_MESSAGE
        seen.append(request)
        return request.make_response(ResponseCode.PULL_NOT_FOUND, ext_fields={
            "suggestWhichBrokerId": "0", "nextBeginOffset": "0", "minOffset": "0", "maxOffset": "0"})

    async def broker_addr_for(topic: str, name: str, *, master_only: bool = True) -> str:
        raise AssertionError("the address is known")

    remoting = SimpleNamespace(invoke=invoke, open_connection=lambda addr: None)
    c._instance = SimpleNamespace(  # type: ignore[assignment]
        remoting=remoting, broker_addr_for=broker_addr_for, find_broker_addr=lambda name, master_only=True: "addr")
    out = []

    async def main() -> None:
        for step in steps:
            if callable(step):
                step(c)
                continue
            offset, size, committed = step
            if committed >= 0:
                c.offset_store.update(MQ, committed)
            await c._pull_once(MQ, ProcessQueue(), offset, size)
            commit = max(c.offset_store.read_memory(MQ), 0)
            flags = H.FLAG_SUSPEND | H.FLAG_SUBSCRIPTION | (H.FLAG_COMMIT_OFFSET if commit > 0 else 0)
            want = c._pull_header(MQ, c._selector(MQ.topic), offset, size, flags, commit).to_ext()
            out.append((seen[-1].ext_fields, want))
    asyncio.run(main())
    return out


def test_the_consumer_sends_what_the_header_gives_as_its_subscription_changes() -> None:
    def resubscribe(expr: str) -> Any:
        def step(c: AsyncPushConsumer) -> None:  # what subscribe() keeps (it also wakes the rebalance)
            c._subs["T"] = (MessageSelector.by_tag(expr), c._subs["T"][1] + 1)
        return step

    def resubscribe_new(expr: str) -> Any:
        def step(c: AsyncPushConsumer) -> None:
            c._subs["T"] = (MessageSelector.by_tag(expr), 1)
        return step

    pulls = run_pulls([(0, 32, -1), (1, 1, 7), resubscribe("TagA"), (2, 5, 9), (3, 5, 9),
                       lambda c: c._subs.pop("T"), (4, 2, 0), resubscribe_new("TagB || TagC"),
                       (5, 32, 11)])
    assert len(pulls) == 6
    for sent, want in pulls:
        assert list(sent.items()) == list(want.items())
    assert [s["subscription"] for s, _ in pulls] == ["a > 1", "a > 1", "TagA", "TagA", "*", "TagB || TagC"]
