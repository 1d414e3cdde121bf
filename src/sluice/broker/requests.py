"""Every request code the broker serves: its handler and the permission it needs (the ACL reads this column).

A new request code is one row here plus a method on a processor. The
BrokerController registers exactly these rows (one handler per code); any other
code is answered REQUEST_CODE_NOT_SUPPORTED.

Permissions follow RocketMQ 4.x's plain ACL
(acl/src/main/java/org/apache/rocketmq/acl/plain/PlainAccessValidator.java:
sends PUB on the topic; pulls, queries, heartbeats and offset commits SUB;
the codes of ``Permission.needAdminPerm`` admin). Codes that class leaves
unchecked are classified here by what they do; each such choice says why. As
in RocketMQ, the permission is on the resources the request names (its topic,
its group's retry topic): a heartbeat of a producer alone names none.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from sluice.broker.admin import AdminProcessor
from sluice.broker.backfill import BackfillProcessor
from sluice.broker.client_manage import ClientManageProcessor
from sluice.broker.filter_admin import FilterAdminProcessor
from sluice.broker.filter_servers import FilterServerManager
from sluice.broker.offset_reset import OffsetResetProcessor
from sluice.broker.ops import OpsProcessor
from sluice.broker.pull import PullProcessor
from sluice.broker.queries import QueryProcessor
from sluice.broker.reply import ReplyProcessor
from sluice.broker.retry import RetryProcessor
from sluice.broker.send import SendProcessor
from sluice.broker.subgroups import SubscriptionGroupProcessor
from sluice.broker.transactions import TransactionService
from sluice.protocol.codes import RequestCode as R

__all__ = ["Permission", "Route", "ROUTES", "ROUTE_BY_CODE"]


class Permission(enum.Enum):
    """What a client must be allowed to do to send a request."""

    NONE = "none"
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Route:
    code: R
    permission: Permission
    processor: type
    method: str  # the handler: this method of the controller's instance of ``processor``

    def __post_init__(self) -> None:
        if not callable(getattr(self.processor, self.method, None)):
            raise TypeError(f"{self.processor.__name__} has no handler {self.method!r} for {self.code!r}")


PUB, SUB, ADMIN, NONE = Permission.PUBLISH, Permission.SUBSCRIBE, Permission.ADMIN, Permission.NONE

ROUTES: tuple[Route, ...] = (
    # ---- producers
    Route(R.SEND_MESSAGE, PUB, SendProcessor, "handle"),
    Route(R.SEND_MESSAGE_V2, PUB, SendProcessor, "handle"),
    Route(R.SEND_BATCH_MESSAGE, PUB, SendProcessor, "handle"),
    # Commits or rolls back a half message: PUB on its real topic (RocketMQ 5.x's validator reads the header's
    # topic; a 4.x header has none, so the handler checks the half's REAL_TOPIC: TransactionService.authorize).
    Route(R.END_TRANSACTION, PUB, TransactionService, "end_transaction"),
    # A reply to a request message (ReplyMessageProcessor): PUB on the reply topic, as any send.
    Route(R.SEND_REPLY_MESSAGE, PUB, ReplyProcessor, "handle"),
    Route(R.SEND_REPLY_MESSAGE_V2, PUB, ReplyProcessor, "handle"),
    # A consumer's failed message stored again: RocketMQ asks PUB on the original topic (and SUB on %RETRY%).
    Route(R.CONSUMER_SEND_MSG_BACK, PUB, RetryProcessor, "handle"),
    # ---- consumers
    Route(R.PULL_MESSAGE, SUB, PullProcessor, "handle"),
    Route(R.QUERY_MESSAGE, SUB, QueryProcessor, "query_message"),
    # Reads a stored message's body, as QUERY_MESSAGE does (RocketMQ leaves it unchecked).
    Route(R.VIEW_MESSAGE_BY_ID, SUB, QueryProcessor, "view_message"),
    Route(R.HEART_BEAT, SUB, ClientManageProcessor, "heartbeat"),
    Route(R.UNREGISTER_CLIENT, SUB, ClientManageProcessor, "unregister_client"),
    Route(R.GET_CONSUMER_LIST_BY_GROUP, SUB, ClientManageProcessor, "consumer_list"),
    # Validates a subscription expression only: reads and changes nothing.
    Route(R.CHECK_CLIENT_CONFIG, NONE, ClientManageProcessor, "check_client_config"),
    Route(R.UPDATE_CONSUMER_OFFSET, SUB, QueryProcessor, "update_consumer_offset"),
    # The offset/queue-bound reads a consumer starts from (RocketMQ leaves them unchecked).
    Route(R.QUERY_CONSUMER_OFFSET, SUB, QueryProcessor, "query_consumer_offset"),
    Route(R.GET_MAX_OFFSET, SUB, QueryProcessor, "get_max_offset"),
    Route(R.GET_MIN_OFFSET, SUB, QueryProcessor, "get_min_offset"),
    Route(R.SEARCH_OFFSET_BY_TIMESTAMP, SUB, QueryProcessor, "search_offset"),
    Route(R.GET_EARLIEST_MSG_STORETIME, SUB, QueryProcessor, "earliest_time"),
    # Orderly consumers' queue locks (RocketMQ leaves them unchecked).
    Route(R.LOCK_BATCH_MQ, SUB, AdminProcessor, "lock_batch"),
    Route(R.UNLOCK_BATCH_MQ, SUB, AdminProcessor, "unlock_batch"),
    # ---- administration
    Route(R.UPDATE_AND_CREATE_TOPIC, ADMIN, AdminProcessor, "create_topic"),
    Route(R.DELETE_TOPIC_IN_BROKER, ADMIN, AdminProcessor, "delete_topic"),
    # Subscription groups (Permission.needAdminPerm lists 200 and 207); the listing reads every group's settings,
    # an operator's view like GET_ALL_TOPIC_CONFIG (RocketMQ leaves it unchecked).
    Route(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, ADMIN, SubscriptionGroupProcessor, "update"),
    Route(R.DELETE_SUBSCRIPTIONGROUP, ADMIN, SubscriptionGroupProcessor, "delete"),
    Route(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, ADMIN, SubscriptionGroupProcessor, "get_all"),
    # Moves a group's committed offsets for every member (RocketMQ leaves it unchecked).
    Route(R.INVOKE_BROKER_TO_RESET_OFFSET, ADMIN, OffsetResetProcessor, "reset_offset"),
    # The introspection behind `sluice admin` (mqadmin's topicList, brokerStatus, topicStatus,
    # consumerProgress, consumerConnection); RocketMQ leaves these unchecked.
    Route(R.GET_ALL_TOPIC_CONFIG, ADMIN, AdminProcessor, "all_topic_config"),
    Route(R.GET_BROKER_RUNTIME_INFO, ADMIN, AdminProcessor, "runtime_info"),
    Route(R.GET_TOPIC_STATS_INFO, ADMIN, AdminProcessor, "topic_stats"),
    Route(R.GET_CONSUME_STATS, ADMIN, AdminProcessor, "consume_stats"),
    Route(R.GET_CONSUMER_CONNECTION_LIST, ADMIN, AdminProcessor, "consumer_connections"),
    # What rocketmq-dashboard and rocketmq-exporter read (ops.py); Permission.needAdminPerm lists 25 and 26,
    # the others read who is connected and how fast (or relay to a consumer, 307/309): operators' requests.
    Route(R.GET_BROKER_CONFIG, ADMIN, OpsProcessor, "get_broker_config"),
    Route(R.UPDATE_BROKER_CONFIG, ADMIN, OpsProcessor, "update_broker_config"),
    Route(R.VIEW_BROKER_STATS_DATA, ADMIN, OpsProcessor, "view_stats_data"),
    Route(R.GET_BROKER_CONSUME_STATS, ADMIN, OpsProcessor, "broker_consume_stats"),
    Route(R.QUERY_TOPIC_CONSUME_BY_WHO, ADMIN, OpsProcessor, "topic_consumed_by"),
    Route(R.GET_PRODUCER_CONNECTION_LIST, ADMIN, OpsProcessor, "producer_connections"),
    Route(R.GET_CONSUMER_RUNNING_INFO, ADMIN, OpsProcessor, "consumer_running_info"),
    Route(R.CONSUME_MESSAGE_DIRECTLY, ADMIN, OpsProcessor, "consume_message_directly"),
    # Sluice's own: `sluice admin explain` (a group's filter data) and `sluice spark backfill` (changes
    # which messages a group's pulls skip).
    Route(R.GET_CONSUMER_FILTER_DATA, ADMIN, FilterAdminProcessor, "filter_data"),
    Route(R.PUT_FILTER_BACKFILL, ADMIN, BackfillProcessor, "handle"),
    # A filter server announcing itself (RocketMQ's AdminBrokerProcessor.registerFilterServer): consumers send
    # their classes and pulls to the addresses it lists, so only an admin account may add one.
    Route(R.REGISTER_FILTER_SERVER, ADMIN, FilterServerManager, "register"),
)

ROUTE_BY_CODE: dict[int, Route] = {int(r.code): r for r in ROUTES}
assert len(ROUTE_BY_CODE) == len(ROUTES), "a request code has two rows"
