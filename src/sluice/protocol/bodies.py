"""JSON bodies of remoting commands (RocketMQ's RemotingSerializable classes), as frozen dataclasses.

``decode_body(cls, cmd.body)`` parses leniently: unknown keys are ignored,
numbers may come as strings, enums as ordinals (librocketmq) or names
(ali-ons, Java), and Java's fastjson form of maps with bare integer keys
(``{0:"host:port"}``) is accepted. ``encode_body(obj)`` writes standard JSON
with string keys, which every client reads.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

import orjson

from sluice.errors import InvalidParameterError
from sluice.protocol import fields

T = TypeVar("T")
_BODY = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
_BARE_INT_KEY = re.compile(rb"([{,]\s*)(-?\d+)(\s*:)")

PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 0x8, 0x4, 0x2, 0x1
MASTER_ID = 0

CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM_WHERE = (
    "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST", "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP",
)


def loads_lenient(data: bytes | str) -> Any:
    """Parse JSON; on failure retry with fastjson's bare integer keys quoted (``{0:"a"}`` -> ``{"0":"a"}``)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as first:
        try:
            return orjson.loads(_BARE_INT_KEY.sub(rb'\1"\2"\3', raw))
        except orjson.JSONDecodeError:
            raise InvalidParameterError(f"body is not valid JSON: {first}") from None


def decode_body(cls: type[T], data: bytes | str) -> T:
    if not data:
        raise InvalidParameterError(f"{cls.__name__}: the request has no body")
    return fields.from_jsonable(cls, loads_lenient(data))


def encode_body(obj: Any) -> bytes:
    return orjson.dumps(fields.to_jsonable(obj))


# ------------------------------------------------------------------------------------------ topics

@_BODY
class TopicConfig:
    topic_name: str = ""  # RegisterBrokerBody tables are keyed by name; readers fall back to the key
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False


@_BODY
class DataVersion:
    timestamp: int = 0
    counter: int = 0


@_BODY
class TopicConfigSerializeWrapper:
    topic_config_table: dict[str, TopicConfig] = dataclasses.field(default_factory=dict)
    data_version: DataVersion = dataclasses.field(default_factory=DataVersion)


@_BODY
class RegisterBrokerBody:
    """REGISTER_BROKER (103) body: the broker's topics and its filter servers."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = dataclasses.field(
        default_factory=TopicConfigSerializeWrapper)
    filter_server_list: list[str] = dataclasses.field(default_factory=list)


@_BODY
class TopicList:
    topic_list: list[str] = dataclasses.field(default_factory=list)
    broker_addr: str | None = None


# ------------------------------------------------------------------------------------------- routes

@_BODY
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_syn_flag: int = 0


@_BODY
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = dataclasses.field(default_factory=dict)

    def select_broker_addr(self) -> str | None:
        """The master if present, else any slave (BrokerData.selectBrokerAddr)."""
        if MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MASTER_ID]
        return next(iter(self.broker_addrs.values()), None)


@_BODY
class TopicRouteData:
    """GET_ROUTEINFO_BY_TOPIC (105) reply body."""

    order_topic_conf: str | None = None
    queue_datas: list[QueueData] = dataclasses.field(default_factory=list)
    broker_datas: list[BrokerData] = dataclasses.field(default_factory=list)
    filter_server_table: dict[str, list[str]] = dataclasses.field(default_factory=dict)


@_BODY
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO (106) reply body."""

    broker_addr_table: dict[str, BrokerData] = dataclasses.field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------------------------ clients

@_BODY
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    class_filter_mode: bool = False
    tags_set: list[str] = dataclasses.field(default_factory=list)
    #: As sent; librocketmq sends zeros here, so a broker recomputes codes from tags_set.
    code_set: list[int] = dataclasses.field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    #: Sluice's own: a class-filter subscription's last error on this client (the class and the cause),
    #: so the broker can show it in consumerProgress; left out when there is none (Java ignores it).
    filter_class_error: str | None = None


@_BODY
class ProducerData:
    group_name: str


@_BODY
class ConsumerData:
    group_name: str
    consume_type: str = fields.wire(default="CONSUME_PASSIVELY", enum=CONSUME_TYPES)
    message_model: str = fields.wire(default="CLUSTERING", enum=MESSAGE_MODELS)
    consume_from_where: str = fields.wire(default="CONSUME_FROM_LAST_OFFSET", enum=CONSUME_FROM_WHERE)
    subscription_data_set: list[SubscriptionData] = dataclasses.field(default_factory=list)
    unit_mode: bool = False


@_BODY
class HeartbeatData:
    """HEART_BEAT (34) body."""

    client_id: str = fields.wire("clientID")
    producer_data_set: list[ProducerData] = dataclasses.field(default_factory=list)
    consumer_data_set: list[ConsumerData] = dataclasses.field(default_factory=list)


@_BODY
class ConsumerListBody:
    """GET_CONSUMER_LIST_BY_GROUP (38) reply body."""

    consumer_id_list: list[str] = dataclasses.field(default_factory=list)


@_BODY
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int


@_BODY
class LockBatchRequestBody:
    """LOCK_BATCH_MQ (41) body."""

    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = dataclasses.field(default_factory=list)
    only_this_broker: bool = False


@_BODY
class LockBatchResponseBody:
    lock_ok_mq_set: list[MessageQueue] = fields.wire("lockOKMQSet", default_factory=list)


@_BODY
class UnlockBatchRequestBody:
    """UNLOCK_BATCH_MQ (42) body."""

    consumer_group: str
    client_id: str
    mq_set: list[MessageQueue] = dataclasses.field(default_factory=list)
    only_this_broker: bool = False


@_BODY
class CheckClientRequestBody:
    """CHECK_CLIENT_CONFIG (46) body: a consumer asks whether the broker accepts its subscription."""

    client_id: str = ""
    group: str
    subscription_data: SubscriptionData | None = None


@_BODY
class KVTable:
    table: dict[str, str] = dataclasses.field(default_factory=dict)
