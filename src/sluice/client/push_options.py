"""What a push consumer's listener returns, where a new group starts, the push and lite pull consumers' options.

Every default is RocketMQ's value unless its comment says otherwise
(client/src/main/java/org/apache/rocketmq/client/consumer/DefaultMQPushConsumer.java,
client/src/main/java/org/apache/rocketmq/client/ClientConfig.java).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from sluice.client.options import check_trace_topic
from sluice.errors import InvalidParameterError
from sluice.protocol.trace import TRACE_TOPIC

__all__ = [
    "AllocateStrategy", "ConsumeFromWhere", "ConsumeOrderlyResult", "ConsumeResult", "MessageModel",
    "LitePullConsumerOptions", "PushConsumerOptions", "parse_consume_timestamp",
]


class ConsumeResult(Enum):
    """ConsumeConcurrentlyStatus: what a concurrent listener returns for its batch."""

    SUCCESS = "CONSUME_SUCCESS"
    #: The whole batch goes back to the broker's %RETRY%<group> topic (delay level 3 + reconsume times).
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyResult(Enum):
    """ConsumeOrderlyStatus: what an orderly listener returns for its batch."""

    SUCCESS = "SUCCESS"
    #: Keep the batch at the head of its queue and try it again after suspend_current_queue_time.
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class MessageModel(str, Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(str, Enum):
    """Where a group starts on a queue for which it has no committed offset (nowhere else)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


#: Allocation strategy names (as RocketMQ's getName()) accepted by the ``allocate_strategy`` option.
AllocateStrategy = str


def parse_consume_timestamp(value: int | str) -> int:
    """Epoch milliseconds, or RocketMQ's ``yyyyMMddHHmmss`` string (local time), to epoch milliseconds."""
    if isinstance(value, int):
        if value < 0:
            raise InvalidParameterError(f"consume_timestamp must be >= 0, got {value}")
        return value
    text = str(value).strip()
    if len(text) != 14 or not text.isdigit():
        raise InvalidParameterError(f"consume_timestamp {value!r} is neither epoch ms nor yyyyMMddHHmmss")
    try:
        return int(time.mktime(time.strptime(text, "%Y%m%d%H%M%S")) * 1000)
    except ValueError as exc:
        raise InvalidParameterError(f"consume_timestamp {value!r}: {exc}") from None


def _half_hour_ago() -> int:
    # RocketMQ's default consumeTimestamp: 30 minutes before the consumer was built.
    return int(time.time() * 1000) - 30 * 60 * 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class PushConsumerOptions:
    #: CLUSTERING (queues shared by the group, offsets on the broker) or BROADCASTING (every member
    #: gets everything, offsets in a local file).
    message_model: str = MessageModel.CLUSTERING.value
    #: Where to start on a queue the group has no committed offset for.
    consume_from_where: str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET.value
    #: With CONSUME_FROM_TIMESTAMP: epoch ms or "yyyyMMddHHmmss"; default half an hour ago.
    consume_timestamp: int | str = dataclasses.field(default_factory=_half_hour_ago)
    #: "AVG" (AllocateMessageQueueAveragely), "AVG_BY_CIRCLE", "CONSISTENT_HASH", or a callable
    #: ``fn(client_id, all_queues, all_client_ids) -> queues`` from sluice.client.allocate.
    allocate_strategy: str | Callable[..., Any] = "AVG"
    #: consumeThreadMax: listener calls running at once (one thread pool per consumer).
    consume_thread_max: int = 20
    #: Sluice: call the listener on the client's I/O thread (its event loop) instead of a consume thread, as
    #: nats-py, pika and stomp.py call their handlers: a delivery reaches the listener without a thread
    #: hand-over. Only for listeners that return quickly and never block: while one runs, the client does
    #: no I/O (this consumer's pulls, its heartbeats, other consumers and producers sharing the client
    #: instance wait), so a call over INLINE_SLOW_S is logged. consume_thread_max then does not apply.
    consume_inline: bool = False
    #: consumeMessageBatchMaxSize: messages per listener call.
    consume_message_batch_max_size: int = 1
    #: pullBatchSize: messages asked per pull.
    pull_batch_size: int = 32
    #: Sluice: while a queue's backlog (the pull answer's maxOffset - nextBeginOffset) exceeds
    #: pull_batch_size, the next pull asks for the backlog, up to this bound (and pull_threshold_for_queue);
    #: a pull that catches up asks pull_batch_size again. Fewer round trips per message when draining; the broker still
    #: caps each answer (max_transfer_count / max_transfer_bytes). At or below pull_batch_size: no growth.
    pull_batch_size_max: int = 256
    #: pullThresholdForQueue / pullThresholdSizeForQueue: stop pulling a queue above this many cached
    #: messages or MiB.
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue: int = 100
    #: consumeConcurrentlyMaxSpan: stop pulling when the cached offsets of a queue span more than this.
    consume_concurrently_max_span: int = 2000
    #: maxReconsumeTimes: -1 means 16 for concurrent consumers, unlimited for orderly ones.
    max_reconsume_times: int = -1
    #: suspendCurrentQueueTimeMillis (in seconds): an orderly queue's pause after a failed batch.
    suspend_current_queue_time: float = 1.0
    #: Concurrent consumers whose send-back to the broker failed retry the batch locally after this
    #: (RocketMQ's submitConsumeRequestLater, 5 s).
    consume_later_delay: float = 5.0
    #: pullInterval: pause between pulls of one queue.
    pull_interval: float = 0.0
    #: BROKER_SUSPEND_MAX_TIME_MILLIS: how long the broker may hold a pull that found nothing.
    broker_suspend_max: float = 15.0
    #: CONSUMER_TIMEOUT_MILLIS_WHEN_SUSPEND: the network timeout of such a pull.
    consumer_timeout_when_suspend: float = 30.0
    #: pullTimeDelayMillsWhenException.
    pull_time_delay_when_exception: float = 1.0
    #: The periodic rebalance (rocketmq.client.rebalance.waitInterval); notifications trigger it at once.
    rebalance_interval: float = 20.0
    #: Orderly: queue locks are renewed this often (the broker expires them after 60 s).
    lock_renew_interval: float = 20.0
    #: Orderly: a lock not renewed for this long is treated as lost by the client (REBALANCE_LOCK_MAX_LIVE_TIME).
    lock_max_live: float = 30.0
    #: Shutdown waits this long for listener calls in flight before committing offsets.
    await_termination: float = 10.0
    #: BROADCASTING offsets live in <dir>/<instance name or DEFAULT>/<group>/offsets.json
    #: (RocketMQ: ~/.rocketmq_offsets).
    offset_store_dir: str = "~/.sluice_offsets"
    #: Check the body CRC of pulled records.
    check_crc: bool = True
    #: Timeout of offset, lock, consumer-list and send-back requests.
    request_timeout: float = 3.0
    #: enableMsgTrace: record SubBefore / SubAfter traces of each listener call (sluice.client.trace).
    enable_trace: bool = False
    #: customizedTraceTopic: where traces go.
    trace_topic: str = TRACE_TOPIC

    def __post_init__(self) -> None:
        check_trace_topic(self.trace_topic)
        try:
            MessageModel(self.message_model)
        except ValueError:
            raise InvalidParameterError(
                f"message_model must be CLUSTERING or BROADCASTING, got {self.message_model!r}") from None
        try:
            ConsumeFromWhere(self.consume_from_where)
        except ValueError:
            raise InvalidParameterError(
                f"consume_from_where must be one of {', '.join(c.value for c in ConsumeFromWhere)}, "
                f"got {self.consume_from_where!r}") from None
        parse_consume_timestamp(self.consume_timestamp)
        if not isinstance(self.consume_inline, bool):
            raise InvalidParameterError(f"consume_inline must be True or False, got {self.consume_inline!r}")
        for name in ("consume_thread_max", "pull_batch_size", "pull_threshold_for_queue",
                     "pull_threshold_size_for_queue", "consume_concurrently_max_span"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.consume_message_batch_max_size <= 1024:
            raise InvalidParameterError("consume_message_batch_max_size must be 1..1024")
        if self.pull_batch_size > 1024:
            raise InvalidParameterError("pull_batch_size must be <= 1024")
        if not 1 <= self.pull_batch_size_max <= 1024:
            raise InvalidParameterError(f"pull_batch_size_max must be 1..1024, got {self.pull_batch_size_max}")
        if self.max_reconsume_times < -1:
            raise InvalidParameterError("max_reconsume_times must be -1 (default) or >= 0")
        if self.broker_suspend_max >= self.consumer_timeout_when_suspend:
            raise InvalidParameterError("broker_suspend_max must be below consumer_timeout_when_suspend")
        if self.rebalance_interval < 1.0:
            raise InvalidParameterError("rebalance_interval must be >= 1 s (RocketMQ's minimum)")
        if not callable(self.allocate_strategy):
            from sluice.client.allocate import STRATEGIES
            if self.allocate_strategy not in STRATEGIES:
                raise InvalidParameterError(f"allocate_strategy must be one of {', '.join(STRATEGIES)} or a "
                                            f"callable, got {self.allocate_strategy!r}")

    def next_pull_size(self, backlog: int) -> int:
        """How many messages the next pull of a queue asks when ``backlog`` messages wait behind the last
        answer on the broker: the backlog, within pull_batch_size and the bound (a filtered backlog may
        match fewer; the broker then answers what its per-pull evaluation limit found)."""
        if backlog <= self.pull_batch_size:
            return self.pull_batch_size
        return max(self.pull_batch_size, min(backlog, self.pull_batch_size_max, self.pull_threshold_for_queue))

    @property
    def model(self) -> MessageModel:
        return MessageModel(self.message_model)

    @property
    def from_where(self) -> ConsumeFromWhere:
        return ConsumeFromWhere(self.consume_from_where)

    def effective_max_reconsume(self, orderly: bool) -> int:
        """getMaxReconsumeTimes: -1 is 16 for concurrent consumers and unlimited for orderly ones."""
        if self.max_reconsume_times >= 0:
            return self.max_reconsume_times
        return 2**31 - 1 if orderly else 16

    def send_back_max_reconsume(self, orderly: bool) -> int | None:
        """The limit a send-back names: None for a concurrent consumer left at -1, so the broker applies the
        subscription group's retryMaxTimes (`sluice admin updateSubGroup -r`); the Java client sends its 16."""
        if self.max_reconsume_times < 0 and not orderly:
            return None
        return self.effective_max_reconsume(orderly)

@dataclasses.dataclass(frozen=True, kw_only=True)
class LitePullConsumerOptions(PushConsumerOptions):
    """The push consumer's options (model, consume_from_where, allocate_strategy, flow-control thresholds,
    rebalance_interval, ...; the listener's are unused) with DefaultLitePullConsumer's defaults and its own."""

    #: pullBatchSize: messages asked per pull, and at most per ``poll``.
    pull_batch_size: int = 10
    #: No backlog-driven growth of pulls: a poll returns one pulled batch, as Java's.
    pull_batch_size_max: int = 10
    #: brokerSuspendMaxTimeMillis: how long the broker may hold a pull that found nothing.
    broker_suspend_max: float = 20.0
    #: autoCommit: each poll commits what the previous polls returned.
    auto_commit: bool = True
    #: autoCommitIntervalMillis (5 s): how often auto-committed offsets are written to the broker.
    auto_commit_interval: float = 5.0
    #: pollTimeoutMillis (5 s): ``poll()``'s wait when it is given no timeout.
    poll_timeout: float = 5.0
    #: pullThresholdForAll: stop pulling while this many messages are cached over all queues.
    pull_threshold_for_all: int = 10000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.auto_commit_interval < 1.0:
            raise InvalidParameterError("auto_commit_interval must be >= 1 s (RocketMQ's minimum)")
        if self.poll_timeout < 0:
            raise InvalidParameterError(f"poll_timeout must be >= 0, got {self.poll_timeout}")
        if self.pull_threshold_for_all < 1:
            raise InvalidParameterError(f"pull_threshold_for_all must be >= 1, got {self.pull_threshold_for_all}")
