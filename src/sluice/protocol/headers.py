"""Typed custom headers (the ``extFields`` of a command), one frozen dataclass per RocketMQ header class.

Field names are RocketMQ's in snake_case; on the wire they are camelCase
(``SendMessageRequestHeaderV2`` uses the one-letter names ``a``..``n``).
Parse with ``Header.from_ext(cmd.ext_fields)`` and render with ``header.to_ext()``;
a missing or malformed field raises InvalidParameterError naming it. Request
extFields may carry extra keys (real clients add ACL fields such as
``AccessKey``/``Signature``/``OnsChannel``); they are ignored.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Self

from sluice.protocol import fields
from sluice.protocol.command import RemotingCommand

_HEADER = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)


class Header:
    """Base of the header dataclasses."""

    __slots__ = ()

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        return fields.from_ext(cls, ext)

    @classmethod
    def from_command(cls, cmd: RemotingCommand) -> Self:
        return fields.from_ext(cls, cmd.ext_fields)

    def to_ext(self) -> dict[str, str]:
        return fields.to_ext(self)


# ------------------------------------------------------------------------------------------------ send

# SendMessageRequestHeaderV2 letters, in field order (a = producerGroup ... n = brokerName).
_V2_NAMES = {
    "producer_group": "a", "topic": "b", "default_topic": "c", "default_topic_queue_nums": "d", "queue_id": "e",
    "sys_flag": "f", "born_timestamp": "g", "flag": "h", "properties": "i", "reconsume_times": "j",
    "unit_mode": "k", "max_reconsume_times": "l", "batch": "m", "broker_name": "n",
}


@_HEADER
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (10) with full names; SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) use letters."""

    producer_group: str
    topic: str
    default_topic: str = "TBW102"
    default_topic_queue_nums: int = 4
    queue_id: int
    sys_flag: int = 0
    born_timestamp: int = 0
    flag: int = 0
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    batch: bool = False
    broker_name: str | None = None

    @classmethod
    def from_v2_ext(cls, ext: Mapping[str, str]) -> SendMessageRequestHeader:
        if _V1_NAMES.isdisjoint(ext):  # letters only (what every SDK sends): read under the letters, no copy
            return _read_v2(ext)
        return cls.from_ext(to_v1_names(ext))

    def to_v2_ext(self) -> dict[str, str]:
        return to_v2_names(self.to_ext())

    @classmethod
    def from_command(cls, cmd: RemotingCommand) -> SendMessageRequestHeader:
        """Either naming, whatever the code: Java sends V2 letters with 320, librocketmq full names with 10."""
        ext = cmd.ext_fields
        if "producerGroup" not in ext and "a" in ext:
            return cls.from_v2_ext(ext)
        return cls.from_ext(ext)


_V1_TO_V2 = {fields.camel(k): v for k, v in _V2_NAMES.items()}
_V2_TO_V1 = {v: k for k, v in _V1_TO_V2.items()}
_V1_NAMES = frozenset(_V1_TO_V2)
_read_v2 = fields.keyed_reader(SendMessageRequestHeader, _V2_NAMES)


def to_v1_names(ext: Mapping[str, str]) -> dict[str, str]:
    """SendMessageRequestHeaderV2.createSendMessageRequestHeaderV1: letters to full names."""
    return {_V2_TO_V1.get(k, k): v for k, v in ext.items()}


def to_v2_names(ext: Mapping[str, str]) -> dict[str, str]:
    """SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2: full names to letters."""
    return {_V1_TO_V2.get(k, k): v for k, v in ext.items()}


@_HEADER
class SendMessageResponseHeader(Header):
    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None


@_HEADER
class ReplyMessageRequestHeader(Header):
    """PUSH_REPLY_MESSAGE_TO_CLIENT (326), broker to the requesting client: the reply's send header plus
    where and when it was stored (ReplyMessageRequestHeader.java). Hosts are Java's
    ``InetSocketAddress.toString()``: ``/127.0.0.1:10911``."""

    producer_group: str
    topic: str
    default_topic: str = "TBW102"
    default_topic_queue_nums: int = 4
    queue_id: int
    sys_flag: int = 0
    born_timestamp: int = 0
    flag: int = 0
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool = False
    born_host: str
    store_host: str
    store_timestamp: int


@_HEADER
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


@_HEADER
class EndTransactionRequestHeader(Header):
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str
    transaction_id: str | None = None
    #: RocketMQ 5.x clients name the real topic (the ACL's PUB resource); 4.x clients do not.
    topic: str | None = None


@_HEADER
class CheckTransactionStateRequestHeader(Header):
    """CHECK_TRANSACTION_STATE (39), broker to producer: the offsets name the half message's latest copy."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None


# ------------------------------------------------------------------------------------------------ pull

# PullMessageRequestHeader.sysFlag bits (common/.../sysflag/PullSysFlag.java), for the clients, the broker
# and the filter servers alike.
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8


@_HEADER
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    subscription: str | None = None
    sub_version: int
    expression_type: str | None = None
    max_msg_bytes: int | None = None
    #: Sluice's: how many consume-queue units a filtered pull may look at, when more than the broker's
    #: window (RocketMQ's maxFilterMessageSize); the push consumer sends the queue offsets its span rule
    #: leaves room for. RocketMQ brokers ignore it (an unknown extField).
    max_scan_units: int | None = None


@_HEADER
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int


# ----------------------------------------------------------------------------------------- offsets & queries

@_HEADER
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int


@_HEADER
class QueryConsumerOffsetResponseHeader(Header):
    offset: int


@_HEADER
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


@_HEADER
class GetMaxOffsetRequestHeader(Header):
    topic: str
    queue_id: int


@_HEADER
class GetMinOffsetRequestHeader(Header):
    topic: str
    queue_id: int


@_HEADER
class OffsetResponseHeader(Header):
    """GetMaxOffsetResponseHeader, GetMinOffsetResponseHeader and SearchOffsetResponseHeader: ``offset``."""

    offset: int


@_HEADER
class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: int
    timestamp: int


@_HEADER
class GetEarliestMsgStoretimeRequestHeader(Header):
    topic: str
    queue_id: int


@_HEADER
class GetEarliestMsgStoretimeResponseHeader(Header):
    timestamp: int


@_HEADER
class QueryMessageRequestHeader(Header):
    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int


@_HEADER
class QueryMessageResponseHeader(Header):
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


@_HEADER
class ViewMessageRequestHeader(Header):
    """VIEW_MESSAGE_BY_ID: ``offset`` is the commit-log offset decoded from an offset message id."""

    offset: int
    topic: str | None = None


# ------------------------------------------------------------------------------------------- clients

@_HEADER
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str


@_HEADER
class UnregisterClientRequestHeader(Header):
    client_id: str = fields.wire("clientID")
    producer_group: str | None = None
    consumer_group: str | None = None


@_HEADER
class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str


@_HEADER
class GetConsumerConnectionListRequestHeader(Header):
    consumer_group: str


@_HEADER
class GetConsumerRunningInfoRequestHeader(Header):
    """GET_CONSUMER_RUNNING_INFO (307), sent by the broker/admin to a client."""

    consumer_group: str
    client_id: str
    jstack_enable: bool = False


@_HEADER
class ConsumeMessageDirectlyResultRequestHeader(Header):
    """CONSUME_MESSAGE_DIRECTLY (309), sent by the broker/admin to a client."""

    consumer_group: str
    client_id: str | None = None
    msg_id: str | None = None
    broker_name: str | None = None
    topic: str | None = None
    topic_sys_flag: int | None = None
    group_sys_flag: int | None = None


@_HEADER
class ResetOffsetRequestHeader(Header):
    """INVOKE_BROKER_TO_RESET_OFFSET (222) and RESET_CONSUMER_CLIENT_OFFSET (220).

    ``queue_id`` and ``offset`` are RocketMQ 5's additions: one queue only (-1: all), and an explicit
    offset instead of the timestamp."""

    topic: str
    group: str
    timestamp: int
    is_force: bool = False
    queue_id: int | None = None
    offset: int | None = None


# ------------------------------------------------------------------------------------------ topics / admin

@_HEADER
class CreateTopicRequestHeader(Header):
    """UPDATE_AND_CREATE_TOPIC (17)."""

    topic: str
    default_topic: str = "TBW102"
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int | None = None
    order: bool = False


@_HEADER
class DeleteTopicRequestHeader(Header):
    """DELETE_TOPIC_IN_BROKER (215) and DELETE_TOPIC_IN_NAMESRV (216)."""

    topic: str
    cluster_name: str | None = None


@_HEADER
class DeleteSubscriptionGroupRequestHeader(Header):
    """DELETE_SUBSCRIPTIONGROUP (207); ``removeOffset`` (RocketMQ 4.9) also drops the group's committed offsets."""

    group_name: str
    remove_offset: bool = False


@_HEADER
class GetTopicStatsInfoRequestHeader(Header):
    topic: str


@_HEADER
class GetConsumeStatsRequestHeader(Header):
    consumer_group: str
    topic: str | None = None


@_HEADER
class ViewBrokerStatsDataRequestHeader(Header):
    """VIEW_BROKER_STATS_DATA (315): one statistic (TOPIC_PUT_NUMS, GROUP_GET_NUMS ...) of one key."""

    stats_name: str
    stats_key: str


@_HEADER
class GetConsumeStatsInBrokerHeader(Header):
    """GET_BROKER_CONSUME_STATS (317); ``isOrder`` on the wire."""

    is_order: bool = False


@_HEADER
class QueryTopicConsumeByWhoRequestHeader(Header):
    """QUERY_TOPIC_CONSUME_BY_WHO (300)."""

    topic: str


@_HEADER
class GetProducerConnectionListRequestHeader(Header):
    """GET_PRODUCER_CONNECTION_LIST (204)."""

    producer_group: str


# ---------------------------------------------------------------------------------------------- namesrv

@_HEADER
class WipeWritePermOfBrokerRequestHeader(Header):
    """WIPE_WRITE_PERM_OF_BROKER (205); ADD_WRITE_PERM_OF_BROKER (327) has the same field. The response's
    ``wipeTopicCount`` / ``addTopicCount`` is the number of topics changed."""

    broker_name: str

@_HEADER
class GetRouteInfoRequestHeader(Header):
    topic: str


@_HEADER
class RegisterBrokerRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str = ""
    broker_id: int
    compressed: bool = False
    body_crc32: int = 0


@_HEADER
class RegisterBrokerResponseHeader(Header):
    ha_server_addr: str | None = None
    master_addr: str | None = None


@_HEADER
class UnRegisterBrokerRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


@_HEADER
class QueryDataVersionRequestHeader(Header):
    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: int


@_HEADER
class QueryDataVersionResponseHeader(Header):
    changed: bool


@_HEADER
class PutKVConfigRequestHeader(Header):
    namespace: str
    key: str
    value: str


@_HEADER
class GetKVConfigRequestHeader(Header):
    namespace: str
    key: str


@_HEADER
class GetKVConfigResponseHeader(Header):
    value: str | None = None
