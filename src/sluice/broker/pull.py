"""PULL_MESSAGE (11) with long polling (RocketMQ's PullMessageProcessor).

The subscription comes from the pull itself when its SUBSCRIPTION flag (0x4)
is set — every real 4.x client sets it — and otherwise from the group's last
heartbeat or its restored filter data (``_filter``). Store statuses map to response codes exactly as RocketMQ maps them
(broker/src/main/java/org/apache/rocketmq/broker/processor/PullMessageProcessor.java).
A PULL_NOT_FOUND with the SUSPEND flag is held in the
HoldService up to the client's suspendTimeoutMillis, then pulled once more
and answered whatever that gives. An answer carries at most max_transfer_count
messages and max_transfer_bytes bytes whatever the pull asks (the first record
always goes), and never more than a 16 MiB frame holds.

A pull with the class-filter flag (0x8) made to the broker itself is refused
with FilterClassError naming the broker's filter servers (or saying none run):
the broker cannot run a filter class, and treating the class name as a tag
would deliver nothing, or everything. A class-filter group's subscription is
kept as ``CLASS`` (broker/filtering.py), whose broker-side filter passes all:
the filter servers pull it and run the class.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from sluice.broker.backfill import BackfillManager
from sluice.broker.config import BrokerConfig
from sluice.broker.consumers import ConsumerManager
from sluice.broker.filter_data import LIVE_MARGIN_MS, ConsumerFilterData, ConsumerFilterManager
from sluice.broker.filtering import (
    CLASS_FILTER, SQL92_DISABLED, CompiledSubscription, SelectorFilter, SqlFilterDisabledError,
)
from sluice.broker.deferred import Deferred
from sluice.broker.longpoll import CLOSED, FULL, HELD, HoldService
from sluice.broker.offsets import ConsumerOffsetManager
from sluice.broker.pool import BlockingPool
from sluice.broker.retry import retry_filter
from sluice.broker.selector_compile import SelectorCompiler
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.broker.subgroups import SubscriptionGroupManager, not_exist
from sluice.broker.topics import TopicConfigManager
from sluice.errors import FilterClassError, FilterError, NoPermissionError, SluiceError, TopicNotExistError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import PullMessageRequestHeader
from sluice.store import MessageStore
from sluice.store.config import MAX_FRAME, PULL_BODY_CEILING
from sluice.store.types import GetMessageResult, GetMessageStatus
from sluice.transport.connection import RemotingConnection

__all__ = ["PullProcessor", "pull_response_code", "FLAG_CLASS_FILTER", "FLAG_COMMIT_OFFSET", "FLAG_SUSPEND",
           "FLAG_SUBSCRIPTION"]

from sluice.protocol.headers import (  # noqa: E402  (PullSysFlag, re-exported: tests name them here)
    FLAG_CLASS_FILTER, FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND,
)

_S = GetMessageStatus
_R = ResponseCode
_FIXED = {
    _S.FOUND: _R.SUCCESS,
    _S.NO_MATCHED_MESSAGE: _R.PULL_RETRY_IMMEDIATELY,
    _S.MESSAGE_WAS_REMOVING: _R.PULL_RETRY_IMMEDIATELY,
    _S.OFFSET_FOUND_NULL: _R.PULL_NOT_FOUND,
    _S.OFFSET_OVERFLOW_ONE: _R.PULL_NOT_FOUND,
    _S.OFFSET_OVERFLOW_BADLY: _R.PULL_OFFSET_MOVED,
    _S.OFFSET_TOO_SMALL: _R.PULL_OFFSET_MOVED,
}


def pull_response_code(status: GetMessageStatus, requested_offset: int) -> ResponseCode:
    """RocketMQ's mapping; an empty or unknown queue means 'moved' unless the client asked for offset 0."""
    code = _FIXED.get(status)
    if code is not None:
        return code
    # NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE
    return _R.PULL_OFFSET_MOVED if requested_offset != 0 else _R.PULL_NOT_FOUND


class PullProcessor:
    def __init__(self, *, config: BrokerConfig, store: MessageStore, pool: BlockingPool, topics: TopicConfigManager,
                 offsets: ConsumerOffsetManager, consumers: ConsumerManager, filter_data: ConsumerFilterManager,
                 sub_guard: SubscriptionGuard, backfills: BackfillManager, hold: HoldService,
                 subgroups: SubscriptionGroupManager | None = None, compiler: SelectorCompiler | None = None,
                 filter_servers: Callable[[], list[str]] | None = None,
                 is_filter_server: Callable[[RemotingConnection], bool] | None = None) -> None:
        self.config = config
        #: The addresses of the filter servers registered with this broker (named when a class-filter pull
        #: reaches the broker directly).
        self.filter_servers = filter_servers or (lambda: [])
        #: Whether a connection is a registered filter server's: its pulls (a class-filter group's messages,
        #: subscription "*") are not a group member's, so the group's subscription conflicts do not apply.
        self.is_filter_server = is_filter_server or (lambda conn: False)
        self.store = store
        self.pool = pool
        self.topics = topics
        self.offsets = offsets
        self.consumers = consumers
        self.filter_data = filter_data
        self.sub_guard = sub_guard
        self.backfills = backfills
        self.hold = hold
        self.subgroups = subgroups
        #: Inline subscriptions, compiled once (clients send the same one with every pull; the result is
        #: shared and never changed, a pull filters with its own copy, SelectorFilter.for_pull); new SQL92
        #: ones compile off the event loop (broker/selector_compile.py).
        self.compiler = compiler or SelectorCompiler(
            max_per_client_per_minute=config.max_selector_compiles_per_client_per_minute)
        self.pulled_messages = 0
        #: Filtered pulls sent to be held at the queue's end after a read that matched nothing, instead of
        #: answered PULL_RETRY_IMMEDIATELY, so far (over the held-pull limits one is still answered at once).
        self.held_after_no_match = 0
        #: Tasks of woken held pulls waiting for dispatch to catch up before their answer.
        self._late: set[asyncio.Task[None]] = set()
        #: Told of each answered pull (topic, group, messages, bytes): the broker's stats.py.
        self.on_get: Callable[[str, str, int, int], None] | None = None

    def _filter(self, h: PullMessageRequestHeader, sub: CompiledSubscription | None,
                for_filter_server: bool = False, conn: RemotingConnection | None = None) -> SelectorFilter | None:
        """The pull's filter (None: everything passes), with the group's Bloom data where it applies.

        A pull carrying its subscription (flag 0x4, every real client) is checked against the group's
        (sub_conflicts.py) and uses the group's registered filter data when the expression is the same;
        otherwise the subscription comes from the group's heartbeat, or after a broker restart from the
        restored filter data. Version checks as RocketMQ's PullMessageProcessor. ``sub`` is the pull's
        compiled inline subscription (flag 0x4). Members whose heartbeats come on the pull's own
        connection (``conn``) are the puller itself: a pull consumer that changed its selector since its
        last heartbeat is not in conflict with itself, and its pull uses its own subscription, as RocketMQ's
        PullMessageProcessor does with hasSubscriptionFlag (except in a class-filter group: only its filter
        servers pull it, since the broker cannot run the class).
        """
        config = self.config
        fm = self.filter_data
        group, topic = h.consumer_group, h.topic
        info = self.consumers.get(group)
        fd = fm.get(topic, group)
        if sub is not None:
            if not for_filter_server:
                members: Any = () if info is None else info.channels
                held = self.sub_guard.group_subscription(group, topic)
                if members and (held is None or held[0] != CLASS_FILTER):  # never unfiltered from a class group
                    members = [cid for cid, ch in info.channels.items() if ch.conn is not conn]
                self.sub_guard.check_pull(group, topic, sub.expression_type, sub.expression, h.sub_version, members)
            base = sub.filter
        else:
            sub = info.subscriptions.get(topic) if info is not None else None
            if sub is not None:
                if sub.sub_version < h.sub_version:
                    raise SluiceError(f"the consumer's subscription not latest (broker has version "
                                      f"{sub.sub_version}, the pull says {h.sub_version})",
                                      code=_R.SUBSCRIPTION_NOT_LATEST)
                base = sub.filter
                if sub.expression_type not in ("TAG", CLASS_FILTER):  # a class has no filter data here
                    self._check_filter_data(fd, h)
            elif fd is not None:  # restored after a restart, before the group's next heartbeat
                self._check_filter_data(fd, h)
                if fd.selector is None:
                    raise FilterError(f"the filter data of group {group!r} on {topic!r} ({fd.expression_type} "
                                      f"{fd.expression!r}) does not compile: {fd.error}")
                if fd.is_sql and not config.enable_property_filter:
                    raise SqlFilterDisabledError(SQL92_DISABLED)
                sub = None
                base = SelectorFilter(fd.selector)
            elif info is None:
                raise SluiceError(f"the consumer's group info not exist: group {group!r} has sent no "
                                  "heartbeat to this broker", code=_R.SUBSCRIPTION_NOT_EXIST)
            else:
                raise SluiceError(f"the consumer's subscription not exist: group {group!r} does not "
                                  f"subscribe topic {topic!r}", code=_R.SUBSCRIPTION_NOT_EXIST)
        if base.passes_all:
            return None
        if base.needs_record and fd is not None and fd.is_sql and fd.selector is not None \
                and fd.expression == base.selector.expression and config.enable_calc_filter_bitmap:
            return base.for_pull(fm.metrics_of(group, topic), fm.bloom, fd.bloom, fd.born_time + LIVE_MARGIN_MS)
        return base.for_pull(fm.metrics_of(group, topic))

    @staticmethod
    def _check_filter_data(fd: ConsumerFilterData | None, h: PullMessageRequestHeader) -> None:
        if fd is None:
            raise SluiceError(f"the consumer's filter data not exist: group {h.consumer_group!r} on topic "
                              f"{h.topic!r}", code=_R.FILTER_DATA_NOT_EXIST)
        if fd.client_version < h.sub_version:
            raise SluiceError(f"the consumer's filter data not latest (broker has version {fd.client_version}, "
                              f"the pull says {h.sub_version})", code=_R.FILTER_DATA_NOT_LATEST)

    def _get_now(self, h: PullMessageRequestHeader, max_msgs: int, mf: SelectorFilter | None,
                 max_bytes: int | None, start: int | None = None) -> GetMessageResult:
        """The store's read for pull ``h``, from ``start`` when given (a woken held pull: past the units its
        filter ruled out as they arrived, longpoll.py ``read_from``), else from the pull's own offset."""
        if start is not None and start < 0:  # _woken_start: the one unit there is judged a match already
            res = self.store.get_messages(h.topic, h.queue_id, ~start, 1, None, max_bytes, 0)
            if res.status is GetMessageStatus.FOUND:
                mf.judged_at_arrival()  # type: ignore[union-attr]  # a SelectorFilter: _woken_start
            return res
        offset = h.queue_offset if start is None else start
        # A group's backfill bitmap for this queue (broker/backfill.py), set afresh for each read.
        mf = self.backfills.attach(mf, h.consumer_group, h.topic, h.queue_id, offset)
        return self.store.get_messages(h.topic, h.queue_id, offset, max_msgs, mf, max_bytes,
                                       h.max_scan_units or 0)

    async def _get(self, h: PullMessageRequestHeader, max_msgs: int, mf: SelectorFilter | None,
                   max_bytes: int | None) -> GetMessageResult:
        if self.config.pull_on_event_loop:
            return self._get_now(h, max_msgs, mf, max_bytes)
        return await self.pool.run(self._get_now, h, max_msgs, mf, max_bytes)

    def handle(self, conn: RemotingConnection, request: RemotingCommand) -> Any:
        """Answered at once when the store has an answer (no task: pulls are the hottest request); a pull
        to be held, or one read on the thread pool, returns the coroutine that finishes it."""
        h = PullMessageRequestHeader.from_command(request)
        if self.subgroups is not None:
            self._check_group(h.consumer_group)
        if h.sys_flag & FLAG_CLASS_FILTER:
            raise self._class_filter_refusal(h)
        topics = self.topics
        cfg = topics.get(h.topic)
        if cfg is None:
            raise TopicNotExistError(f"topic[{h.topic}] not exist, apply first please!")
        topics.check_readable(cfg)
        if not 0 <= h.queue_id < cfg.read_queue_nums:
            raise SluiceError(f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] "
                              f"topicConfig.readQueueNums:[{cfg.read_queue_nums}] consumer:[{conn.peer}]")
        sub = None
        if h.sys_flag & FLAG_SUBSCRIPTION:
            sub = self.compiler.cached(h.topic, h.expression_type, h.subscription, h.sub_version,
                                       self.config.enable_property_filter)
            if sub is None:  # a new SQL92 expression: compiled off the loop while this pull waits
                return self._compile_and_pull(conn, request, h)
        return self._pull(conn, request, h, sub)

    def _check_group(self, group: str) -> None:
        """The group's subscription group allows this pull (PullMessageProcessor, its remarks): it exists (an
        unknown one is served with the defaults, created by heartbeats), consumeEnable, and
        consumeBroadcastEnable for a broadcasting group."""
        subgroups = self.subgroups
        assert subgroups is not None
        sg = subgroups.get(group)
        if sg is None:  # the defaults allow everything (no config is built per pull)
            if not subgroups.serves_unknown(group):
                raise not_exist(group)
            return
        if not sg.consume_enable:
            raise NoPermissionError(f"subscription group no permission, {group}")
        if not sg.consume_broadcast_enable:
            info = self.consumers.get(group)
            if info is not None and info.message_model == "BROADCASTING":
                raise NoPermissionError(f"the consumer group[{group}] can not consume by broadcast way")

    def _class_filter_refusal(self, h: PullMessageRequestHeader) -> FilterClassError:
        servers = sorted(self.filter_servers())
        where = (f"pull from one of this broker's filter servers: {', '.join(servers)}" if servers else
                 "no filter server runs beside this broker (set filter_server_nums in its config)")
        # The request table logs the refusal (one line, with the peer).
        return FilterClassError(
            f"a class-filter pull (sysFlag 0x8) of group {h.consumer_group!r} on topic {h.topic!r} "
            f"(class {h.subscription!r}) reached the broker, which never runs filter classes; {where}",
            class_name=h.subscription or "", cause="class-filter pull sent to the broker")

    async def _compile_and_pull(self, conn: RemotingConnection, request: RemotingCommand,
                                h: PullMessageRequestHeader) -> RemotingCommand:
        sub = await self.compiler.compile(conn.attributes, conn.peer, h.topic, h.expression_type, h.subscription,
                                          h.sub_version, self.config.enable_property_filter)
        res = self._pull(conn, request, h, sub)
        return res if isinstance(res, RemotingCommand) else await res

    def _pull(self, conn: RemotingConnection, request: RemotingCommand, h: PullMessageRequestHeader,
              sub: CompiledSubscription | None) -> Any:
        # %RETRY%<group>: filtered by the group's subscriptions of the original topics
        mf = retry_filter(self.consumers, h.consumer_group, h.topic,
                          self._filter(h, sub, sub is not None and self.is_filter_server(conn), conn))
        if mf is not None:  # records evaluated per pull (store/pull_read.py stops there): this pull's own filter
            mf.max_evaluations = self.config.max_evaluations_per_pull
        if h.sys_flag & FLAG_COMMIT_OFFSET:
            self.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        # Bounded whatever the pull asks (RocketMQ's maxTransferCount/BytesOnMessageInMemory, docs/broker.md).
        config = self.config
        max_msgs = min(max(1, h.max_msg_nums), config.max_transfer_count)
        max_bytes = min(h.max_msg_bytes, config.max_transfer_bytes) if h.max_msg_bytes and h.max_msg_bytes > 0 \
            else config.max_transfer_bytes
        if not self.config.pull_on_event_loop:
            return self._wait_and_answer(conn, request, h, max_msgs, mf, max_bytes, None)
        res = self._get_now(h, max_msgs, mf, max_bytes)
        code = pull_response_code(res.status, h.queue_offset)
        at = self._hold_at(h, res, code)
        if at is not None:
            return self._hold_then_answer(conn, request, at, max_msgs, mf, max_bytes, res, code)
        return self._answer(request, h, res, code)

    def _hold_at(self, h: PullMessageRequestHeader, res: GetMessageResult, code: int
                 ) -> PullMessageRequestHeader | None:
        """The pull to hold, both roads' one decision: with the SUSPEND flag, a PULL_NOT_FOUND as it is, and
        a read that got to the queue's end with nothing matched as if made from that end (counted in
        ``held_after_no_match``); else None, answered at once. RocketMQ answers such a read
        PULL_RETRY_IMMEDIATELY, and the client's next pull, from the end, is then held: a round trip for every
        run of unmatched arrivals between two matches (most of a selective group's pulls). Held from the end
        instead, as that next pull would be: an arrival that matches is answered as it comes, a timeout with
        PULL_NOT_FOUND and nextBeginOffset past the units read."""
        if not h.sys_flag & FLAG_SUSPEND:
            return None
        if code == _R.PULL_NOT_FOUND:
            return h
        if res.status is not _S.NO_MATCHED_MESSAGE or res.next_begin_offset < res.max_offset:
            return None
        self.held_after_no_match += 1
        return dataclasses.replace(h, queue_offset=res.next_begin_offset)

    def _hold_then_answer(self, conn: RemotingConnection, request: RemotingCommand, h: PullMessageRequestHeader,
                          max_msgs: int, mf: SelectorFilter | None, max_bytes: int | None,
                          res: GetMessageResult, code: int) -> Any:
        """:meth:`_wait_and_answer` for a pull read on the loop, without a task: the hold service calls back
        when it is woken (or times out) and the callback pulls once more and writes the answer on ``conn``
        itself; the gate counts the request in flight until then (``Deferred``)."""
        config = self.config
        timeout_ms = h.suspend_timeout_millis if config.long_polling_enable else config.short_polling_ms
        deferred = Deferred()
        read_from = [h.queue_offset, -1]  # the hold service moves it past the arrivals the filter rules out

        def then(woke: int) -> None:
            conn.busy -= 1
            if woke == CLOSED:
                deferred.settle()
                return
            if woke > 0 and self.store.dispatch.reput_offset < woke:  # dispatch lags (its thread): wait off-loop
                conn.busy += 1
                task = asyncio.get_running_loop().create_task(
                    self._late_answer(conn, request, h, max_msgs, mf, max_bytes, woke, deferred,
                                      self._woken_start(h, mf, woke, read_from)))
                self._late.add(task)  # the loop keeps only a weak reference to a task
                task.add_done_callback(self._late.discard)
                return
            try:
                response = self._answer_now(request, h, max_msgs, mf, max_bytes,
                                            self._woken_start(h, mf, woke, read_from))
            except Exception as exc:
                conn.answer(request, exc)
                deferred.settle(exc)
                return
            conn.answer(request, response)
            deferred.settle()

        conn.busy += 1  # not idle while held (as a handler task would keep it); ``then`` may run at once (closed)
        state = self.hold.hold_then(h.topic, h.queue_id, h.queue_offset, mf, max(0, timeout_ms) / 1000.0, conn, then,
                                    read_from=read_from)
        if state == HELD:
            return deferred
        conn.busy -= 1
        if state == FULL:
            return self._answer(request, h, res, code)
        return self._answer_now(request, h, max_msgs, mf, max_bytes)  # the queue grew meanwhile: pull again now

    def _woken_start(self, h: PullMessageRequestHeader, mf: SelectorFilter | None, woke: int,
                     read_from: list[int]) -> int | None:
        """Where a held pull's read starts once it is answered: woken by an arrival it wants, past the units
        its filter ruled out as they arrived (the same answer, fewer units read: a sparse subscription's
        wake-up reads the unit that matched, not every unit since its last answer); after a timeout or a
        re-check, from its own offset, as RocketMQ re-reads. As ``~start`` (negative) when the unit there,
        the queue's last, woke it with the verdict the read would give: the read takes that one record
        without judging it again (``_get_now``), unless a backfill bitmap has a say on this queue."""
        start, judged = read_from
        if woke <= 0:
            return None
        if mf is not None and start > h.queue_offset:
            mf.skipped_unread(start - h.queue_offset)
        if judged == start and isinstance(mf, SelectorFilter) \
                and self.store.get_max_offset(h.topic, h.queue_id) == start + 1 \
                and (h.consumer_group, h.topic, h.queue_id) not in self.backfills.table:
            return ~start
        return start if start > h.queue_offset else None

    def _answer_now(self, request: RemotingCommand, h: PullMessageRequestHeader, max_msgs: int,
                    mf: SelectorFilter | None, max_bytes: int | None, start: int | None = None) -> RemotingCommand:
        res = self._get_now(h, max_msgs, mf, max_bytes, start)
        return self._answer(request, h, res, pull_response_code(res.status, h.queue_offset))

    async def _late_answer(self, conn: RemotingConnection, request: RemotingCommand, h: PullMessageRequestHeader,
                           max_msgs: int, mf: SelectorFilter | None, max_bytes: int | None, woke: int,
                           deferred: Deferred, start: int | None) -> None:
        exc: Exception | None = None
        try:
            await self.pool.run(self.store.dispatch.wait_for, woke, 1.0)
            response = self._answer_now(request, h, max_msgs, mf, max_bytes, start)
        except Exception as e:
            exc = e
            conn.answer(request, e)
        else:
            conn.answer(request, response)
        finally:
            conn.busy -= 1
            deferred.settle(exc)

    async def _wait_and_answer(self, conn: RemotingConnection, request: RemotingCommand,
                               h: PullMessageRequestHeader, max_msgs: int,
                               mf: SelectorFilter | None, max_bytes: int | None,
                               res: GetMessageResult | None) -> RemotingCommand:
        """Read on the thread pool (``res`` None), and hold a PULL_NOT_FOUND with the SUSPEND flag up to the
        client's suspend timeout (long polling), then pull once more. Over the held-pull limits (the
        connection's or the broker's) the PULL_NOT_FOUND is answered at once: the client polls again."""
        if res is None:
            res = await self._get(h, max_msgs, mf, max_bytes)
        code = pull_response_code(res.status, h.queue_offset)
        at = self._hold_at(h, res, code)
        if at is not None:
            config = self.config
            timeout_ms = h.suspend_timeout_millis if config.long_polling_enable else config.short_polling_ms
            woke = await self.hold.hold(at.topic, at.queue_id, at.queue_offset, mf, max(0, timeout_ms) / 1000.0,
                                        conn)
            if woke == FULL:
                return self._answer(request, h, res, code)
            if woke > 0 and self.store.dispatch.reput_offset < woke:  # no thread hop when dispatch is there
                await self.pool.run(self.store.dispatch.wait_for, woke, 1.0)
            res = await self._get(at, max_msgs, mf, max_bytes)
            code = pull_response_code(res.status, at.queue_offset)
        return self._answer(request, h, res, code)

    def _answer(self, request: RemotingCommand, h: PullMessageRequestHeader, res: GetMessageResult,
                code: int) -> RemotingCommand:
        fields = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(res.next_begin_offset),
                  "minOffset": str(res.min_offset), "maxOffset": str(res.max_offset)}
        if code == _R.SUCCESS:
            if len(res.data) > PULL_BODY_CEILING:  # only a record stored under a larger max_message_size
                raise SluiceError(f"the record at queue offset {res.queue_offsets[0]} is "
                                  f"{len(res.data)} bytes, more than a {MAX_FRAME}-byte frame can carry",
                                  code=_R.SYSTEM_ERROR)
            self.pulled_messages += res.message_count
            if self.on_get is not None:
                self.on_get(h.topic, h.consumer_group, res.message_count, len(res.data))
            return request.make_response(code, ext_fields=fields, body=res.data)
        return request.make_response(code, _REMARKS.get(code), ext_fields=fields)


_REMARKS = {
    _R.PULL_NOT_FOUND: "no new message",
    _R.PULL_RETRY_IMMEDIATELY: "no matched message, pull again from nextBeginOffset",
    _R.PULL_OFFSET_MOVED: "the requested offset is out of the queue's range",
}
