"""Client bookkeeping requests (RocketMQ's ClientManageProcessor and ConsumerManageProcessor).

HEART_BEAT (34) accepts both enum forms (ordinals from librocketmq, names from
ali-ons/Java), recomputes tag codes from the subscription strings (never
trusting the client's ``codeSet``), keeps a class-filter subscription (classFilterMode)
as its class name (never a tag expression; the filter servers run it, and a member's
last class error is kept for consumerProgress), compiles SQL92 subscriptions — new ones off the
event loop, bounded per connection (selector_compile.py); one bad
expression refuses the whole heartbeat with SUBSCRIPTION_PARSE_FAILED — and
creates the group's subscription group (subgroups.py, when auto-creation allows) and its ``%RETRY%``
topic with the group's retryQueueNums. A member subscribing differently from its
group is refused (sub_conflicts.py); accepted subscriptions become the group's
consumer filter data (filter_data.py). UNREGISTER_CLIENT (35),
GET_CONSUMER_LIST_BY_GROUP (38) and CHECK_CLIENT_CONFIG (46) complete the set.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from sluice.broker.consumers import ConsumerManager
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.filtering import CLASS_FILTER, CompiledSubscription, class_subscription
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.selector_compile import SelectorCompiler
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.broker.subgroups import SubscriptionGroupManager
from sluice.broker.topics import RETRY_PREFIX, TopicConfigManager, retry_topic
from sluice.errors import InvalidParameterError, SluiceError
from sluice.protocol.bodies import (ConsumerData, ConsumerListBody, HeartbeatData, SubscriptionData, decode_body,
                                    encode_body, loads_lenient)
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.fields import from_jsonable
from sluice.protocol.headers import GetConsumerListByGroupRequestHeader, UnregisterClientRequestHeader
from sluice.transport.connection import RemotingConnection

__all__ = ["ClientManageProcessor"]

CLIENT_ID = "client_id"  # key in RemotingConnection.attributes
#: Subscription versions below this (2001-09-09 in epoch ms) are not times.
_PLAUSIBLE_MS = 10**12


class ClientManageProcessor:
    def __init__(self, *, consumers: ConsumerManager, topics: TopicConfigManager, topics_changed: Callable[[], None],
                 filter_data: ConsumerFilterManager, sub_guard: SubscriptionGuard,
                 enable_property_filter: bool, compiler: SelectorCompiler | None = None,
                 subgroups: SubscriptionGroupManager | None = None,
                 offsets: ConsumerOffsetManager | None = None) -> None:
        self.consumers = consumers
        self.topics = topics
        self.topics_changed = topics_changed
        self.filter_data = filter_data
        self.sub_guard = sub_guard
        self.subgroups = subgroups
        self.offsets = offsets  # where push groups first subscribed (note_subscribed)
        self.enable_property_filter = enable_property_filter
        self.compiler = compiler or SelectorCompiler(max_per_client_per_minute=600)

    async def _compile(self, conn: RemotingConnection, sd: SubscriptionData) -> CompiledSubscription:
        """From the compile cache at once, or compiled off the loop (counted against the connection)."""
        c = self.compiler
        sub = c.cached(sd.topic, sd.expression_type, sd.sub_string, sd.sub_version, self.enable_property_filter)
        if sub is not None:
            return sub
        return await c.compile(conn.attributes, conn.peer, sd.topic, sd.expression_type, sd.sub_string,
                               sd.sub_version, self.enable_property_filter)

    async def heartbeat(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        consumers, topics = self.consumers, self.topics
        hb = decode_body(HeartbeatData, request.body)
        if not hb.client_id:
            raise InvalidParameterError("heartbeat without clientID")
        # Compile everything first: a bad subscription must not leave half a registration behind.
        compiled: list[tuple[ConsumerData, list[CompiledSubscription]]] = []
        for cd in hb.consumer_data_set:
            if not cd.group_name:
                raise InvalidParameterError("heartbeat consumer data without groupName")
            # A class-filter subscription names a class the filter servers run: never a tag expression.
            subs = [class_subscription(sd.topic, sd.sub_string, sd.sub_version) if sd.class_filter_mode
                    else await self._compile(conn, sd) for sd in cd.subscription_data_set]
            compiled.append((cd, subs))
        # Members of a group must subscribe alike (sub_conflicts.py): refuse before registering anything.
        for cd, subs in compiled:
            info = consumers.get(cd.group_name)
            self.sub_guard.check_heartbeat(cd.group_name, hb.client_id,
                                        [(s.topic, s.expression_type, s.expression, s.sub_version) for s in subs],
                                        info.channels if info is not None else ())
        conn.attributes[CLIENT_ID] = hb.client_id
        created = False
        for cd, subs in compiled:
            # RocketMQ's heartBeat: the group's config (auto-created) decides the retry topic's queues; a group
            # unknown with auto-creation off still registers (its pulls are refused), without a retry topic.
            sg = self.subgroups.find(cd.group_name) if self.subgroups is not None else None
            rt = retry_topic(cd.group_name)
            if (sg is not None or self.subgroups is None) and topics.get(rt) is None:
                topics.create_retry_or_dlq(rt, max(1, sg.retry_queue_nums if sg is not None else 1))
                created = True
            consumers.register_consumer(
                cd.group_name, hb.client_id, conn, language=request.language, version=request.version,
                consume_type=cd.consume_type, message_model=cd.message_model,
                consume_from_where=cd.consume_from_where, subscriptions=subs,
                class_errors={sd.topic: sd.filter_class_error for sd in cd.subscription_data_set
                              if sd.class_filter_mode and sd.filter_class_error})
            if self.offsets is not None and cd.consume_type == "CONSUME_PASSIVELY":
                self._note_subscribed(cd.group_name, cd.subscription_data_set)
            self.filter_data.register_group(cd.group_name, [(s.topic, s.expression_type, s.expression,
                                                             s.sub_version, s.filter.selector) for s in subs
                                                            if s.expression_type != CLASS_FILTER])
        for pd in hb.producer_data_set:
            consumers.register_producer(pd.group_name, hb.client_id, conn, language=request.language,
                                        version=request.version)
        if created:
            self.topics_changed()
        return request.make_response()

    def _note_subscribed(self, group: str, subs: list[SubscriptionData]) -> None:
        """The moment a push group first subscribed each topic (broker/queries.py starts a new group there):
        the subscription's version, which clients set to the time they subscribed (Java, librocketmq and
        ali-ons: epoch ms), else now. A version in the future (clock skew) or not a plausible time is now."""
        assert self.offsets is not None
        now = int(time.time() * 1000)
        for sd in subs:
            if sd.topic.startswith(RETRY_PREFIX):
                continue
            v = sd.sub_version
            self.offsets.note_subscribed(group, sd.topic, v if _PLAUSIBLE_MS <= v <= now else now)

    async def unregister_client(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = UnregisterClientRequestHeader.from_command(request)
        consumers = self.consumers
        if h.consumer_group:
            consumers.unregister_consumer(h.consumer_group, h.client_id)
        if h.producer_group:
            consumers.unregister_producer(h.producer_group, h.client_id)
        return request.make_response()

    async def consumer_list(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = GetConsumerListByGroupRequestHeader.from_command(request)
        info = self.consumers.get(h.consumer_group)
        if info is None or not info.channels:
            raise SluiceError(f"no consumer for this group, {h.consumer_group}")
        return request.make_response(body=encode_body(ConsumerListBody(consumer_id_list=info.client_ids())))

    async def check_client_config(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        if not request.body:
            raise InvalidParameterError("CHECK_CLIENT_CONFIG without a body")
        doc = loads_lenient(request.body)
        if not isinstance(doc, dict) or not isinstance(doc.get("subscriptionData"), dict):
            raise InvalidParameterError("CHECK_CLIENT_CONFIG body needs a subscriptionData object")
        sd = from_jsonable(SubscriptionData, doc["subscriptionData"], "subscriptionData")
        await self._compile(conn, sd)
        return request.make_response(ResponseCode.SUCCESS)
