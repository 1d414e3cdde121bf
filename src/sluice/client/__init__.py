"""The Python SDK: producers and pull consumers speaking RocketMQ's protocol.

Blocking (``Producer``, ``PullConsumer``) and asyncio (``AsyncProducer``,
``AsyncPullConsumer``) flavours share one implementation. See docs/sdk.md.
"""
from sluice.client.facade import Producer, PullConsumer
from sluice.client.fault import MQFaultStrategy
from sluice.client.instance import ClientConfig, ClientInstance
from sluice.client.options import ProducerOptions, PullConsumerOptions
from sluice.client.producer import AsyncProducer
from sluice.client.pull_consumer import AsyncPullConsumer
from sluice.client.results import MessageQueue, PullResult, PullStatus, SendResult, SendStatus
from sluice.client.routing import QueueSelector, select_by_hash, select_by_random
from sluice.client.selector import MessageSelector

__all__ = [
    "AsyncProducer", "AsyncPullConsumer", "ClientConfig", "ClientInstance", "MQFaultStrategy", "MessageQueue",
    "MessageSelector", "Producer", "ProducerOptions", "PullConsumer", "PullConsumerOptions", "PullResult",
    "PullStatus", "QueueSelector", "SendResult", "SendStatus", "select_by_hash", "select_by_random",
]
