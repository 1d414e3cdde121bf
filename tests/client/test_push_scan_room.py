"""What a push consumer's pull asks the broker to scan (maxScanUnits): its span rule's room for filtered
subscriptions of a concurrent listener, nothing otherwise. No server: the pull goes to a recording fake."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.client import ConsumeResult, MessageSelector
from sluice.client.process_queue import ProcessQueue
from sluice.client.push_consumer import AsyncPushConsumer
from sluice.client.results import MessageQueue, PullStatus
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand

MQ = MessageQueue(topic="T", broker_name="b", queue_id=0)


def sent_scan(selector: MessageSelector, *, orderly: bool = False, **options: Any) -> str | None:
    """The maxScanUnits field of the PULL_MESSAGE the consumer sends for ``MQ``."""
    c = AsyncPushConsumer("G", "127.0.0.1:1", **options)
    c.subscribe("T", selector)
    c.register_listener(lambda msgs: ConsumeResult.SUCCESS, orderly=orderly)
    seen: list[RemotingCommand] = []

    async def invoke(addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        seen.append(request)
        return request.make_response(ResponseCode.PULL_NOT_FOUND, ext_fields={
            "suggestWhichBrokerId": "0", "nextBeginOffset": "0", "minOffset": "0", "maxOffset": "0"})

    async def broker_addr_for(topic: str, name: str, *, master_only: bool = True) -> str:
        return "addr"

    remoting = SimpleNamespace(invoke=invoke, open_connection=lambda addr: None)  # no open connection: invoke
    c._instance = SimpleNamespace(  # type: ignore[assignment]
        remoting=remoting, broker_addr_for=broker_addr_for, find_broker_addr=lambda name, master_only=True: None)
    result = asyncio.run(c._pull_once(MQ, ProcessQueue(), 0, 32))
    assert result.status is PullStatus.NO_NEW_MSG and len(seen) == 1
    return seen[0].ext_fields.get("maxScanUnits")


@pytest.mark.parametrize("selector", [MessageSelector.by_sql("a > 1"), MessageSelector.by_tag("TagA || TagB")])
def test_a_filtered_subscription_asks_for_its_span_room(selector: MessageSelector) -> None:
    assert sent_scan(selector) == "2000"  # consume_concurrently_max_span's default
    assert sent_scan(selector, consume_concurrently_max_span=5000) == "5000"


def test_unfiltered_and_orderly_pulls_leave_the_window_to_the_broker() -> None:
    assert sent_scan(MessageSelector.by_tag("*")) is None
    assert sent_scan(MessageSelector.by_sql("a > 1"), orderly=True) is None
