"""The Python SDK: producers, pull consumers and push consumers speaking RocketMQ's protocol.

Blocking (``Producer``, ``PullConsumer``) and asyncio (``AsyncProducer``,
``AsyncPullConsumer``) flavours share one implementation. See docs/sdk.md.
"""
from sluice.client.allocate import STRATEGIES as ALLOCATE_STRATEGIES
from sluice.client.push_options import (
    ConsumeFromWhere, ConsumeOrderlyResult, ConsumeResult, MessageModel, PushConsumerOptions,
)
from sluice.client.facade import Producer, PullConsumer
from sluice.client.fault import MQFaultStrategy
from sluice.client.instance import ClientConfig, ClientInstance
from sluice.client.options import ProducerOptions, PullConsumerOptions
from sluice.client.producer import AsyncProducer
from sluice.client.pull_consumer import AsyncPullConsumer
from sluice.client.push_consumer import AsyncPushConsumer, PushConsumer
from sluice.client.results import MessageQueue, PullResult, PullStatus, SendResult, SendStatus
from sluice.client.routing import QueueSelector, select_by_hash, select_by_random
from sluice.client.selector import MessageSelector

__all__ = [
    "ALLOCATE_STRATEGIES", "AsyncPushConsumer", "ConsumeFromWhere", "ConsumeOrderlyResult", "ConsumeResult",
    "MessageModel", "PushConsumer", "PushConsumerOptions",
    "AsyncProducer", "AsyncPullConsumer", "ClientConfig", "ClientInstance", "MQFaultStrategy", "MessageQueue",
    "MessageSelector", "Producer", "ProducerOptions", "PullConsumer", "PullConsumerOptions", "PullResult",
    "PullStatus", "QueueSelector", "SendResult", "SendStatus", "select_by_hash", "select_by_random",
]
