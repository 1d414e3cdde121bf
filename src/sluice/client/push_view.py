"""What a push consumer's services use of their consumer, as a ``typing.Protocol``.

The rebalancer, the consume services and the running-info report are built by
:class:`sluice.client.push_consumer.AsyncPushConsumer` and call back into it; the lite pull consumer
(:class:`sluice.client.lite_pull.AsyncLitePullConsumer`) is one too, for its rebalancer and running info.
They name it through :class:`PushConsumerView`, so none of them imports the
module that builds them (no import circle), and what they may use is written down.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sluice.client.instance import ClientInstance
    from sluice.client.offset_store import OffsetStore
    from sluice.client.process_queue import ProcessQueue
    from sluice.client.push_options import PushConsumerOptions
    from sluice.client.results import MessageQueue
    from sluice.message import MessageExt
    from sluice.protocol.bodies import ConsumerData

__all__ = ["PushConsumerView", "QueueTable"]


class QueueTable(Protocol):
    """The rebalancer as others see it: the queues this consumer owns now."""

    @property
    def process_queues(self) -> Mapping[MessageQueue, ProcessQueue]: ...


class PushConsumerView(Protocol):
    """The push consumer (AsyncPushConsumer) as its rebalancer, consume services and running info use it."""

    @property
    def group(self) -> str: ...

    @property
    def options(self) -> PushConsumerOptions: ...

    @property
    def instance(self) -> ClientInstance:
        """The started consumer's client instance (ClientError before start)."""

    @property
    def offset_store(self) -> OffsetStore: ...

    @property
    def rebalancer(self) -> QueueTable: ...

    @property
    def listener(self) -> Callable[[list[MessageExt]], Any] | None:
        """The registered message listener (CONSUME_MESSAGE_DIRECTLY calls it)."""

    @property
    def orderly(self) -> bool:
        """Whether the listener is orderly (one queue at a time, queues locked on the broker)."""

    @property
    def running(self) -> bool: ...

    @property
    def consume_timestamp_ms(self) -> int:
        """Where CONSUME_FROM_TIMESTAMP starts, epoch ms."""

    @property
    def start_timestamp_ms(self) -> int: ...

    def topics(self) -> list[str]:
        """Every topic rebalanced: the subscriptions, and the group's retry topic in CLUSTERING."""

    def consumer_data(self) -> ConsumerData:
        """The group's entry in a heartbeat."""

    def start_pulling(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        """Pull ``mq`` into ``pq`` from ``offset`` (replacing a pull loop already running for it)."""

    async def do_rebalance(self) -> bool:
        """Rebalance every topic now; False when one should be retried soon."""

    async def reset_offsets(self, topic: str, offsets: Mapping[MessageQueue, int]) -> list[MessageQueue]:
        """Consume ``topic`` from these offsets now, dropping what is cached (a broker's
        RESET_CONSUMER_CLIENT_OFFSET); the owned queues restarted."""
