"""Sluice: a RocketMQ 4.x compatible message queue in Python, built around server-side filtering."""
from sluice.errors import SluiceError
from sluice.message import Message, MessageExt
from sluice.client import (
    ALLOCATE_STRATEGIES, AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, ConsumeFromWhere, ConsumeOrderlyResult,
    ConsumeResult, MessageModel, MessageQueue, MessageSelector, Producer, PullConsumer, PullResult, PullStatus,
    PushConsumer, SendResult, SendStatus, select_by_hash,
)

__version__ = "0.1.0"
__all__ = [
    "ALLOCATE_STRATEGIES", "AsyncPushConsumer", "ConsumeFromWhere", "ConsumeOrderlyResult", "ConsumeResult",
    "MessageModel", "PushConsumer",
    "AsyncProducer", "AsyncPullConsumer", "Message", "MessageExt", "MessageQueue", "MessageSelector", "Producer",
    "PullConsumer", "PullResult", "PullStatus", "SendResult", "SendStatus", "SluiceError", "__version__",
    "select_by_hash",
]
