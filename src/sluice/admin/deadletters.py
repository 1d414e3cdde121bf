"""Dead letters: resendDeadLetters moves messages of ``%DLQ%<group>`` back to the topics they came from.

Each dead letter is read with a plain pull (the admin tool never joins the
group, so its consumers do not rebalance), and sent again to its original topic
(the DLQ_ORIGIN_TOPIC, RETRY_TOPIC or REAL_TOPIC property, in that order) with
its body, tags, keys, user properties and msgId (UNIQ_KEY; ``--new-id`` gives
fresh ones); the retry bookkeeping properties are dropped and reconsumeTimes
starts again at 0. Progress is kept as the group's committed offset on the DLQ
topic, so a second run resends only letters that arrived since, and
consumerProgress shows the letters not resent yet as that topic's lag.
"""
from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass
from typing import Any

import click

from sluice.admin.core import admin_command
from sluice.admin.output import Result, table
from sluice.admin.session import ADMIN_PRODUCER_GROUP, AdminSession
from sluice.admin.status import ExitStatus, exit_status_for
from sluice.client.encoding import DEFAULT_COMPRESS_LEVEL, DEFAULT_COMPRESS_OVER, PreparedSend, build_send_request, \
    parse_send_response
from sluice.client.results import MessageQueue, PullStatus, SendResult
from sluice.client.selector import MessageSelector
from sluice.errors import NotFoundError, SluiceError, TopicNotExistError
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.msgid import new_unique_id
from sluice.protocol.record import FLAG_COMPRESSED, check_topic

__all__ = ["RESEND_DROPPED_PROPERTIES", "origin_topic", "resend_properties"]

DLQ_PREFIX, RETRY_PREFIX = "%DLQ%", "%RETRY%"
PULL_BATCH = 32
#: Properties of the retry/DLQ path, pull results and transactions: not part of the message being resent.
RESEND_DROPPED_PROPERTIES = frozenset({
    P.RETRY_TOPIC, P.REAL_TOPIC, P.REAL_QID, P.DLQ_ORIGIN_TOPIC, P.DLQ_ORIGIN_MESSAGE_ID, P.ORIGIN_MESSAGE_ID,
    P.MIN_OFFSET, P.MAX_OFFSET, P.RECONSUME_TIME, P.MAX_RECONSUME_TIMES, P.DELAY, P.CONSUME_START_TIME,
    P.TIMER_DELIVER_MS, P.TIMER_DELAY_SEC, P.TIMER_DELAY_MS, P.TRAN_MSG, P.PGROUP, "__transactionId__",
    "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "MSG_REGION",
    "TRACE_ON",
})


def origin_topic(m: MessageExt) -> str | None:
    """The topic a dead letter was first sent to, or None when it does not say."""
    for name in (P.DLQ_ORIGIN_TOPIC, P.RETRY_TOPIC, P.REAL_TOPIC):
        value = m.properties.get(name)
        if value and not value.startswith((DLQ_PREFIX, RETRY_PREFIX)):
            return value
    return None


def resend_properties(m: MessageExt, *, new_id: bool) -> dict[str, str]:
    props = {k: v for k, v in m.properties.items() if k not in RESEND_DROPPED_PROPERTIES}
    if new_id or not props.get(P.UNIQ_KEY):
        props[P.UNIQ_KEY] = new_unique_id()
    return props


@dataclass(slots=True)
class _Outcome:
    queue_id: int
    offset: int
    msg_id: str
    origin: str | None
    result: str  # "resent", "would resend", "skipped"
    detail: str = ""
    new_offset_msg_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"queueId": self.queue_id, "queueOffset": self.offset, "msgId": self.msg_id,
                "originTopic": self.origin, "result": self.result, "detail": self.detail,
                "newOffsetMsgId": self.new_offset_msg_id}


class _Resender:
    def __init__(self, s: AdminSession, *, new_id: bool) -> None:
        self.s = s
        self.new_id = new_id
        self._rr: dict[str, itertools.count[int]] = {}
        self._known: dict[str, str | None] = {}  # topic -> None if it exists, else why not

    async def topic_problem(self, topic: str) -> str | None:
        if topic not in self._known:
            try:
                check_topic(topic)
                await self.s.route(topic)
                self._known[topic] = None
            except TopicNotExistError:
                self._known[topic] = f"original topic {topic!r} does not exist any more"
            except SluiceError as exc:
                self._known[topic] = f"original topic {topic!r}: {exc}"
        return self._known[topic]

    async def send(self, m: MessageExt, topic: str) -> SendResult:
        producer = await self.s.producer()
        queues = await producer.fetch_publish_queues(topic)
        mq = queues[next(self._rr.setdefault(topic, itertools.count())) % len(queues)]
        props = resend_properties(m, new_id=self.new_id)
        body, sys_flag = m.body, 0
        if len(body) >= DEFAULT_COMPRESS_OVER:
            body, sys_flag = zlib.compress(body, DEFAULT_COMPRESS_LEVEL), FLAG_COMPRESSED
        prepared = PreparedSend(topic, body, P.encode_properties(props), sys_flag, m.flag, props[P.UNIQ_KEY])
        # reconsumeTimes goes out as 0: a resent letter gets its full retry budget again.
        request = build_send_request(prepared, mq, group=ADMIN_PRODUCER_GROUP)
        addr = await producer.instance.broker_addr_for(topic, mq.broker_name, master_only=True)
        response = await producer.instance.remoting.invoke(addr, request, producer.options.send_timeout)
        return parse_send_response(response, prepared, mq)


@admin_command("resendDeadLetters", aliases=["resend-dead-letters", "dlqResend", "dlq-resend"])
@click.option("-g", "--consumerGroup", "group", required=True, help="The group whose %DLQ% topic is read.")
@click.option("-i", "--msgId", "msg_ids", multiple=True,
              help="Only these (msgId or offsetMsgId; repeatable); offsets are then left as they are.")
@click.option("--max", "max_num", type=click.IntRange(min=1), help="Resend at most this many.")
@click.option("--all", "from_start", is_flag=True, help="Start at the DLQ's first message, not at the last run's end.")
@click.option("--dry-run", is_flag=True, help="Only list what would be resent.")
@click.option("--new-id", is_flag=True, help="Give resent messages new msgIds (default: keep the original).")
async def resend_dead_letters(s: AdminSession, group: str, msg_ids: tuple[str, ...], max_num: int | None,
                              from_start: bool, dry_run: bool, new_id: bool) -> Result:
    """Send a group's dead letters back to their original topics."""
    dlq = DLQ_PREFIX + group
    try:
        queues = await s.read_queues(dlq)
    except TopicNotExistError:
        raise NotFoundError(f"group {group!r} has no dead-letter topic {dlq} "
                            "(no message of it ever ran out of retries)") from None
    wanted = set(msg_ids)
    seen: set[str] = set()  # the -i ids met in the DLQ
    commit = not dry_run and not wanted
    resender = _Resender(s, new_id=new_id)
    outcomes: list[_Outcome] = []
    offsets: list[dict[str, Any]] = []
    failure: SluiceError | None = None
    for mq in queues:
        if failure is not None or (max_num is not None and _count(outcomes) >= max_num):
            break
        addr = await s.master_addr(dlq, mq.broker_name)
        lo, hi = await s.min_offset(addr, mq), await s.max_offset(addr, mq)
        committed = await s.committed_offset(addr, group, mq)
        start = lo if from_start or committed < 0 else max(committed, lo)
        pos, failure = await _resend_queue(s, resender, mq, group, start, hi, wanted, seen, max_num, dry_run,
                                           outcomes)
        if commit and pos > committed:  # never moves the group's DLQ progress back (--all with --max)
            await s.commit_offset(addr, group, mq, pos)
        offsets.append({"brokerName": mq.broker_name, "queueId": mq.queue_id, "from": start, "to": pos,
                        "committed": commit})
    missing = sorted(wanted - seen)
    if missing and not seen:
        raise NotFoundError(f"{dlq} holds none of {', '.join(missing)} (from the offset each queue starts at; "
                            "--all starts at the first letter kept)")
    resent = sum(o.result == "resent" for o in outcomes)
    skipped = [o for o in outcomes if o.result == "skipped"]
    rows = [(o.queue_id, o.offset, o.msg_id, o.origin or "?", o.result, o.new_offset_msg_id or o.detail)
            for o in outcomes]
    t = table(None, ["QID", "DLQ Offset", "Msg ID", "Original Topic", "Result", "Detail"], rows,
              right=["QID", "DLQ Offset"])
    verb = "would resend" if dry_run else "resent"
    notes = [f"{dlq}: {verb} {_count(outcomes)}, skipped {len(skipped)}"
             + ("" if commit else " (offsets not changed)")]
    warnings = [f"skipped {o.msg_id} at {dlq} offset {o.offset}: {o.detail}" for o in skipped]
    warnings += [f"{dlq} does not hold {i}" for i in missing]
    status = ExitStatus.PARTIAL if skipped or missing else ExitStatus.SUCCESS
    if failure is not None:
        warnings.append(f"stopped: {failure}")
        status = ExitStatus.PARTIAL if resent else exit_status_for(failure)
    data = {"group": group, "deadLetterTopic": dlq, "dryRun": dry_run, "resent": resent, "skipped": len(skipped),
            "messages": [o.to_json() for o in outcomes], "offsets": offsets,
            "error": None if failure is None else str(failure)}
    return Result(data, [t], notes, warnings, status)


def _count(outcomes: list[_Outcome]) -> int:
    return sum(o.result != "skipped" for o in outcomes)


async def _resend_queue(s: AdminSession, resender: _Resender, mq: MessageQueue, group: str, start: int, hi: int,
                        wanted: set[str], seen: set[str], max_num: int | None, dry_run: bool,
                        outcomes: list[_Outcome]) -> tuple[int, SluiceError | None]:
    """Resend from ``start`` up to ``hi``; returns the offset after the last letter dealt with, and the error
    that stopped the run (the letter it failed on is not passed, so the next run tries it again)."""
    pos = start
    everything = MessageSelector.by_tag("*")
    while pos < hi:
        r = await s.pull(mq, everything, pos, PULL_BATCH, group=group)
        if r.status is PullStatus.NO_NEW_MSG or r.next_begin_offset <= pos:
            break
        for m in r.msg_found_list:
            if max_num is not None and _count(outcomes) >= max_num:
                return pos, None
            if wanted:
                hit = wanted & {m.msg_id, m.offset_msg_id}
                if not hit:
                    pos = m.queue_offset + 1
                    continue
                seen |= hit
            origin = origin_topic(m)
            problem = "it names no original topic" if origin is None else await resender.topic_problem(origin)
            if problem is not None:
                outcomes.append(_Outcome(mq.queue_id, m.queue_offset, m.msg_id, origin, "skipped", problem))
            elif dry_run:
                outcomes.append(_Outcome(mq.queue_id, m.queue_offset, m.msg_id, origin, "would resend"))
            else:
                assert origin is not None
                try:
                    sent = await resender.send(m, origin)
                except SluiceError as exc:
                    return pos, exc
                outcomes.append(_Outcome(mq.queue_id, m.queue_offset, m.msg_id, origin, "resent",
                                         new_offset_msg_id=sent.offset_msg_id))
            pos = m.queue_offset + 1
        pos = max(pos, r.next_begin_offset)
    return pos, None
