"""client/consume_directly.py: CONSUME_MESSAGE_DIRECTLY's ConsumeMessageDirectlyResult for each listener outcome
(ConsumeMessageConcurrentlyService / ConsumeMessageOrderlyService.consumeMessageDirectly)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from sluice.client.consume_directly import consume_directly
from sluice.client.push_options import ConsumeOrderlyResult, ConsumeResult
from sluice.message import MessageExt


@dataclass
class View:
    listener: Any
    orderly: bool = False


def msg() -> MessageExt:
    return MessageExt(topic="T", body=b"b", properties={}, queue_id=0, queue_offset=0, commitlog_offset=0,
                      msg_id="m", offset_msg_id="o", sysflag=0, flag=0, born_timestamp=0, born_host=("1.2.3.4", 1),
                      store_timestamp=0, store_host=("1.2.3.4", 2), reconsume_times=0, body_crc=0, store_size=0)


def boom(msgs: list[MessageExt]) -> Any:
    raise ValueError("bad message")


@pytest.mark.parametrize("listener, orderly, result, remark", [
    (lambda m: ConsumeResult.SUCCESS, False, "CR_SUCCESS", None),
    (lambda m: ConsumeResult.RECONSUME_LATER, False, "CR_LATER", None),
    (lambda m: ConsumeOrderlyResult.SUSPEND_CURRENT_QUEUE_A_MOMENT, True, "CR_LATER", None),
    (lambda m: None, False, "CR_RETURN_NULL", None),
    (boom, False, "CR_THROW_EXCEPTION", "ValueError: bad message"),
    (lambda m: 42, False, "CR_THROW_EXCEPTION", "the listener returned 42, not a ConsumeResult"),
])
def test_results(listener: Any, orderly: bool, result: str, remark: str | None) -> None:
    got = asyncio.run(consume_directly(View(listener, orderly), msg()))  # type: ignore[arg-type]
    assert got["consumeResult"] == result and got["order"] is orderly and got["autoCommit"] is True
    assert got.get("remark") == remark
    assert got["spentTimeMills"] >= 0


def test_the_listener_gets_the_one_message() -> None:
    seen: list[list[MessageExt]] = []
    m = msg()
    asyncio.run(consume_directly(View(lambda ms: seen.append(ms) or ConsumeResult.SUCCESS), m))  # type: ignore[arg-type]
    assert seen == [[m]]
