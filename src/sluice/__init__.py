"""Sluice: a RocketMQ 4.x compatible message queue in Python, built around server-side filtering."""
from sluice.errors import SluiceError
from sluice.message import Message, MessageExt
from sluice.client import (
    AsyncProducer, AsyncPullConsumer, MessageQueue, MessageSelector, Producer, PullConsumer, PullResult, PullStatus,
    SendResult, SendStatus, select_by_hash,
)

__version__ = "0.1.0"
__all__ = [
    "AsyncProducer", "AsyncPullConsumer", "Message", "MessageExt", "MessageQueue", "MessageSelector", "Producer",
    "PullConsumer", "PullResult", "PullStatus", "SendResult", "SendStatus", "SluiceError", "__version__",
    "select_by_hash",
]
