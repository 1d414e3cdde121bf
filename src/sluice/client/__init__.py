"""The Python SDK: producers, pull consumers and push consumers speaking RocketMQ's protocol.

Blocking (``Producer``, ``PullConsumer``) and asyncio (``AsyncProducer``,
``AsyncPullConsumer``) flavours share one implementation. See docs/sdk.md.
Names are imported on first use (PEP 562), so a producer does not load the consumers.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.client.allocate import STRATEGIES as ALLOCATE_STRATEGIES
    from sluice.client.facade import Producer, PullConsumer
    from sluice.client.fault import MQFaultStrategy
    from sluice.client.instance import ClientConfig, ClientInstance
    from sluice.client.lite_pull import AsyncLitePullConsumer, LitePullConsumer
    from sluice.client.options import ProducerOptions, PullConsumerOptions
    from sluice.client.producer import AsyncProducer
    from sluice.client.reply import ReplyMessage, reply_to
    from sluice.client.pull_consumer import AsyncPullConsumer
    from sluice.client.push_consumer import AsyncPushConsumer, PushConsumer
    from sluice.client.push_options import (
        ConsumeFromWhere, ConsumeOrderlyResult, ConsumeResult, LitePullConsumerOptions, MessageModel,
        PushConsumerOptions,
    )
    from sluice.client.results import MessageQueue, PullResult, PullStatus, SendResult, SendStatus
    from sluice.client.routing import QueueSelector, select_by_hash, select_by_random
    from sluice.client.selector import MessageSelector
    from sluice.client.transaction import (
        AsyncTransactionProducer, LocalTransactionState, TransactionProducer, TransactionSendResult,
    )

__all__ = [
    "ALLOCATE_STRATEGIES", "AsyncPushConsumer", "ConsumeFromWhere", "ConsumeOrderlyResult", "ConsumeResult",
    "MessageModel", "PushConsumer", "PushConsumerOptions",
    "AsyncProducer", "AsyncPullConsumer", "ClientConfig", "ClientInstance", "MQFaultStrategy", "MessageQueue",
    "MessageSelector", "Producer", "ProducerOptions", "PullConsumer", "PullConsumerOptions", "PullResult",
    "PullStatus", "QueueSelector", "SendResult", "SendStatus", "select_by_hash", "select_by_random",
    "AsyncTransactionProducer", "LocalTransactionState", "TransactionProducer", "TransactionSendResult",
    "ReplyMessage", "reply_to", "AsyncLitePullConsumer", "LitePullConsumer", "LitePullConsumerOptions",
]

# public name -> (module, name there)
_HOME: dict[str, tuple[str, str]] = {"ALLOCATE_STRATEGIES": ("allocate", "STRATEGIES")}
for _module, _names in {
    "facade": ("Producer", "PullConsumer"),
    "fault": ("MQFaultStrategy",),
    "instance": ("ClientConfig", "ClientInstance"),
    "lite_pull": ("AsyncLitePullConsumer", "LitePullConsumer"),
    "options": ("ProducerOptions", "PullConsumerOptions"),
    "producer": ("AsyncProducer",),
    "reply": ("ReplyMessage", "reply_to"),
    "pull_consumer": ("AsyncPullConsumer",),
    "push_consumer": ("AsyncPushConsumer", "PushConsumer"),
    "push_options": ("ConsumeFromWhere", "ConsumeOrderlyResult", "ConsumeResult", "LitePullConsumerOptions",
                     "MessageModel", "PushConsumerOptions"),
    "results": ("MessageQueue", "PullResult", "PullStatus", "SendResult", "SendStatus"),
    "routing": ("QueueSelector", "select_by_hash", "select_by_random"),
    "selector": ("MessageSelector",),
    "transaction": ("AsyncTransactionProducer", "LocalTransactionState", "TransactionProducer",
                    "TransactionSendResult"),
}.items():
    _HOME.update((_name, (_module, _name)) for _name in _names)
del _module, _names


def __getattr__(name: str) -> Any:
    try:
        module, attr = _HOME[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
