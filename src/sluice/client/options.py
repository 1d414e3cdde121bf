"""Keyword options of producers and consumers, split into the instance-wide part and the rest.

Every default is RocketMQ's (DefaultMQProducer / DefaultMQPullConsumer / ClientConfig) unless it says otherwise.
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from sluice.client.instance import ClientConfig
from sluice.errors import InvalidParameterError, MessageIllegalError
from sluice.protocol.record import check_topic
from sluice.protocol.trace import TRACE_TOPIC

__all__ = ["ProducerOptions", "PullConsumerOptions", "check_trace_topic", "split_options"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProducerOptions:
    #: sendMsgTimeout: the whole send, retries included, in seconds.
    send_timeout: float = 3.0
    #: retryTimesWhenSendFailed (also used for asynchronous sends): attempts after the first.
    retry_times: int = 2
    #: compressMsgBodyOverHowmuch: bodies of this many bytes or more are zlib-compressed.
    compress_over: int = 4096
    #: rocketmq.message.compressLevel.
    compress_level: int = 5
    #: maxMessageSize: the body limit checked before sending.
    max_message_size: int = 4 * 1024 * 1024
    #: sendLatencyFaultEnable: keep slow or failing brokers out of queue choice for a while.
    send_latency_fault_enable: bool = False
    #: Which MQFaultStrategy table: "4.9" (4.9.7, Sluice speaks 4.x) or "5".
    latency_table: str = "4.9"
    #: createTopicKey: the topic whose route a new topic borrows until the broker has created it.
    create_topic_key: str = "TBW102"
    #: defaultTopicQueueNums: queues per broker of an auto-created topic.
    default_topic_queue_nums: int = 4
    #: Send with SEND_MESSAGE_V2 (one-letter header), as Java clients do; False uses SEND_MESSAGE.
    use_v2_header: bool = True
    #: retryAnotherBrokerWhenNotStoreOK: retry a send the broker stored but not as durably as asked.
    retry_another_broker_when_not_store_ok: bool = False
    #: enableMsgTrace: record a Pub trace of each send in the trace topic (sluice.client.trace).
    enable_trace: bool = False
    #: customizedTraceTopic: where traces go.
    trace_topic: str = TRACE_TOPIC
    #: autoBatch (RocketMQ 5): sends of a topic made while another of its sends is in flight wait and go
    #: together as one batch, each with its own result (client/accumulate.py). Off by default, as there.
    auto_batch: bool = False
    #: batchMaxDelayMs: the longest a send waits for the topic's send in flight before it goes anyway.
    batch_max_delay_ms: int = 10
    #: batchMaxBytes: waiting bodies of a topic go at once when they reach this many bytes.
    batch_max_bytes: int = 32 * 1024

    def __post_init__(self) -> None:
        check_trace_topic(self.trace_topic)
        if self.send_timeout <= 0:
            raise InvalidParameterError(f"send_timeout must be positive, got {self.send_timeout}")
        if self.retry_times < 0:
            raise InvalidParameterError(f"retry_times must be >= 0, got {self.retry_times}")
        if not 0 <= self.compress_level <= 9:
            raise InvalidParameterError(f"compress_level must be 0..9, got {self.compress_level}")
        if self.max_message_size <= 0:
            raise InvalidParameterError(f"max_message_size must be positive, got {self.max_message_size}")
        if self.default_topic_queue_nums <= 0:
            raise InvalidParameterError("default_topic_queue_nums must be positive")
        if self.batch_max_delay_ms < 0:
            raise InvalidParameterError(f"batch_max_delay_ms must be >= 0, got {self.batch_max_delay_ms}")
        if self.batch_max_bytes <= 0:
            raise InvalidParameterError(f"batch_max_bytes must be positive, got {self.batch_max_bytes}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PullConsumerOptions:
    #: consumerPullTimeoutMillis: a non-blocking pull's network timeout.
    pull_timeout: float = 10.0
    #: brokerSuspendMaxTimeMillis of DefaultMQPullConsumer: how long a blocking pull waits on the broker.
    broker_suspend_max: float = 20.0
    #: consumerTimeoutMillisWhenSuspend: a blocking pull's network timeout.
    consumer_timeout_when_suspend: float = 30.0
    #: CLUSTERING (offsets on the broker) or BROADCASTING; announced in heartbeats.
    message_model: str = "CLUSTERING"
    #: Check the body CRC of pulled records (Java's client does not; it is cheap, so Sluice does).
    check_crc: bool = True
    #: Timeout of offset and lookup requests.
    request_timeout: float = 3.0

    def __post_init__(self) -> None:
        if self.message_model not in ("CLUSTERING", "BROADCASTING"):
            raise InvalidParameterError(f"message_model must be CLUSTERING or BROADCASTING, got {self.message_model!r}")
        if self.broker_suspend_max >= self.consumer_timeout_when_suspend:
            raise InvalidParameterError("broker_suspend_max must be below consumer_timeout_when_suspend")


def check_trace_topic(topic: str) -> None:
    """InvalidParameterError naming the option for a trace topic that is no valid topic name."""
    try:
        check_topic(topic)
    except MessageIllegalError as exc:
        raise InvalidParameterError(f"trace_topic: {exc}") from None


def split_options(cls: type[T], options: dict[str, Any]) -> tuple[T, ClientConfig]:
    """Keyword options to (``cls`` options, instance options); unknown names are refused by name."""
    own = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    shared = {f.name for f in dataclasses.fields(ClientConfig)}
    unknown = sorted(set(options) - own - shared)
    if unknown:
        raise InvalidParameterError(
            f"unknown option(s): {', '.join(unknown)}; known: {', '.join(sorted(own | shared))}")
    try:
        return (cls(**{k: v for k, v in options.items() if k in own}),
                ClientConfig(**{k: v for k, v in options.items() if k in shared}))
    except TypeError as exc:
        raise InvalidParameterError(str(exc)) from None
