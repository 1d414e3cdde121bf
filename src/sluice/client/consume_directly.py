"""CONSUME_MESSAGE_DIRECTLY (309): an operator asks a push consumer to consume one stored message now.

As RocketMQ's ClientRemotingProcessor.consumeMessageDirectly and
ConsumeMessageConcurrentlyService / ConsumeMessageOrderlyService
.consumeMessageDirectly (client/src/main/java/org/apache/rocketmq/client/impl/
consumer/): the message (the request body, a stored record) is given to the
group's listener on its own, outside any queue, and the answer is a
ConsumeMessageDirectlyResult: ``order``, ``autoCommit``, ``consumeResult``
(CMResult: CR_SUCCESS, CR_LATER, CR_RETURN_NULL, CR_THROW_EXCEPTION),
``remark`` and ``spentTimeMills``. Offsets and retries are not touched: the
operator sees what the listener did.
"""
from __future__ import annotations

import asyncio
import time
import traceback
from typing import TYPE_CHECKING, Any

from sluice.client.push_options import ConsumeOrderlyResult, ConsumeResult
from sluice.message import MessageExt

if TYPE_CHECKING:
    from sluice.client.push_view import PushConsumerView

__all__ = ["consume_directly"]

_CM_RESULT = {ConsumeResult.SUCCESS: "CR_SUCCESS", ConsumeResult.RECONSUME_LATER: "CR_LATER",
              ConsumeOrderlyResult.SUCCESS: "CR_SUCCESS",
              ConsumeOrderlyResult.SUSPEND_CURRENT_QUEUE_A_MOMENT: "CR_LATER"}


def _call(consumer: PushConsumerView, msg: MessageExt) -> tuple[str, str | None]:
    listener = consumer.listener
    if listener is None:
        return "CR_THROW_EXCEPTION", "the consumer has no message listener"
    try:
        status = listener([msg])
    except Exception as exc:  # reported to the operator, as RocketMQ's CR_THROW_EXCEPTION with the cause
        return "CR_THROW_EXCEPTION", "".join(traceback.format_exception_only(exc)).strip()
    if status is None:
        return "CR_RETURN_NULL", None
    result = _CM_RESULT.get(status)
    if result is None:
        return "CR_THROW_EXCEPTION", f"the listener returned {status!r}, not a ConsumeResult"
    return result, None


async def consume_directly(consumer: PushConsumerView, msg: MessageExt) -> dict[str, Any]:
    """Run the listener on ``msg`` off the event loop; the ConsumeMessageDirectlyResult as JSON-ready data."""
    t0 = time.monotonic()
    result, remark = await asyncio.get_running_loop().run_in_executor(None, _call, consumer, msg)
    out: dict[str, Any] = {"order": consumer.orderly, "autoCommit": True, "consumeResult": result,
                           "spentTimeMills": int((time.monotonic() - t0) * 1000)}
    if remark is not None:
        out["remark"] = remark
    return out
