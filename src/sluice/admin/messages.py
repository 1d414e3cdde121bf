"""Message commands: queryMsgByKey, queryMsgById, queryMsgByUniqueKey, sendMessage, consumeMessage.

Two ids, never mixed up: ``msgId`` is the producer's unique id (the UNIQ_KEY
property, what SendResult.msg_id returns); ``offsetMsgId`` is the broker's id
(store host, port and commit-log offset). queryMsgById takes the latter,
queryMsgByUniqueKey the former, and each says so when handed the other kind.
Queries return every stored copy they find (with ``-g``: the group's retry and
dead-letter copies too), labelled with its role, deduplicated, newest first.
"""
from __future__ import annotations

from pathlib import Path
import click

from sluice.admin.core import admin_command, current_env
from sluice.admin.output import Result, body_preview, fmt_time, message_detail, message_json, message_role, table
from sluice.admin.params import KEY_VALUE, TIMESTAMP
from sluice.admin.session import TOOLS_CONSUMER_GROUP, AdminSession
from sluice.client.broker_api import decode_messages
from sluice.client.results import MessageQueue, PullStatus
from sluice.client.selector import MessageSelector
from sluice.errors import InvalidParameterError, NotFoundError, SluiceError, TopicNotExistError
from sluice.message import Message, MessageExt
from sluice.protocol.msgid import decode_offset_msg_id

#: Pull batch of consumeMessage.
PULL_BATCH = 32


def _list_result(msgs: list[MessageExt], what: str) -> Result:
    rows = [(message_role(m.topic), m.msg_id, m.offset_msg_id, m.topic, m.queue_id, m.queue_offset, m.tags or "",
             " ".join(m.keys), fmt_time(m.store_timestamp)) for m in msgs]
    t = table(None, ["Role", "Msg ID", "Offset Msg ID", "Topic", "QID", "Offset", "Tags", "Keys", "Stored"], rows,
              right=["QID", "Offset"])
    tables = [t] if len(msgs) > 1 else [message_detail(msgs[0], role=message_role(msgs[0].topic))]
    return Result({"messages": [message_json(m, role=message_role(m.topic)) for m in msgs]}, tables,
                  [f"{len(msgs)} message(s) {what}"])


async def _query_copies(s: AdminSession, topic: str, key: str, max_num: int, begin: int, end: int,
                        group: str | None, *, unique_key: bool) -> list[MessageExt]:
    """The topic's matches, plus with ``group`` those in its %RETRY% and %DLQ% topics (which may not exist)."""
    out = await s.query_by_key(topic, key, max_num, begin, end, unique_key=unique_key)
    if group:
        for extra in (f"%RETRY%{group}", f"%DLQ%{group}"):
            try:
                out += await s.query_by_key(extra, key, max_num, begin, end, unique_key=unique_key)
            except TopicNotExistError:
                continue
    seen: set[str] = set()
    unique = [m for m in out if not (m.offset_msg_id in seen or seen.add(m.offset_msg_id))]  # type: ignore[func-returns-value]
    return unique[:max_num]  # maxNum bounds the whole answer, not each broker's


@admin_command("queryMsgByKey", aliases=["query-msg-by-key"])
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True, help="One of the KEYS the producer set.")
@click.option("-b", "--beginTimestamp", "begin", type=TIMESTAMP, default=0, help="Stored at or after [default: any].")
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP, default=0, help="Stored at or before [default: any].")
@click.option("-c", "--maxNum", "max_num", type=click.IntRange(1, 64), default=64, show_default=True)
@click.option("-g", "--consumerGroup", "group", help="Also look in this group's retry and dead-letter topics.")
async def query_msg_by_key(s: AdminSession, topic: str, key: str, begin: int, end: int, max_num: int,
                           group: str | None) -> Result:
    """Messages whose KEYS contain a key (the broker's key index, checked exactly)."""
    msgs = await _query_copies(s, topic, key, max_num, begin, end, group, unique_key=False)
    if not msgs:
        raise NotFoundError(f"no message with key {key!r} in topic {topic!r}"
                            + (" in that time range" if begin or end else ""))
    return _list_result(msgs, f"with key {key!r}")


@admin_command("queryMsgByUniqueKey", aliases=["query-msg-by-unique-key"])
@click.option("-t", "--topic", required=True)
@click.option("-i", "--msgId", "msg_id", required=True, help="The producer's msgId (UNIQ_KEY).")
@click.option("-g", "--consumerGroup", "group", help="Also look in this group's retry and dead-letter topics.")
@click.option("-c", "--maxNum", "max_num", type=click.IntRange(1, 64), default=32, show_default=True)
async def query_msg_by_unique_key(s: AdminSession, topic: str, msg_id: str, group: str | None,
                                  max_num: int) -> Result:
    """A message by the id its producer got (SendResult.msg_id), with every stored copy of it."""
    msgs = await _query_copies(s, topic, msg_id, max_num, 0, 0, group, unique_key=True)
    if not msgs:
        hint = ""
        try:
            where = decode_offset_msg_id(msg_id)
            known = {b.addr for b in await s.brokers(masters_only=False)}
            if where.address in known:
                hint = f"; {msg_id} is an offsetMsgId of broker {where.address}: try queryMsgById -i {msg_id}"
        except SluiceError:
            pass
        raise NotFoundError(f"no message with msgId (UNIQ_KEY) {msg_id!r} in topic {topic!r}{hint}")
    return _list_result(msgs, f"with msgId {msg_id}")


@admin_command("queryMsgById", aliases=["query-msg-by-id"])
@click.option("-i", "--msgId", "msg_ids", required=True,
              help="The broker's offsetMsgId (several: comma-separated).")
@click.option("-t", "--topic", help="If an id is a producer msgId (UNIQ_KEY), look it up in this topic.")
async def query_msg_by_id(s: AdminSession, msg_ids: str, topic: str | None) -> Result:
    """Messages by offsetMsgId: read straight from the broker the id names."""
    ids = [i.strip() for i in msg_ids.split(",") if i.strip()]
    if not ids:
        raise click.UsageError("-i/--msgId is empty")
    known = {b.addr for b in await s.brokers(masters_only=False)}
    found: list[MessageExt] = []
    for mid in ids:
        found.append(await _view(s, mid, known, topic))
    return _list_result(found, "found")


async def _view(s: AdminSession, mid: str, known: set[str], topic: str | None) -> MessageExt:
    not_offset_id = f"{mid} is not an offsetMsgId of any registered broker"
    try:
        where = decode_offset_msg_id(mid)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{mid!r} is not a message id: {exc}") from None
    if where.address in known:
        try:
            msgs = decode_messages(await s.view_message(where.address, where.offset))
        except SluiceError as exc:
            raise NotFoundError(f"broker {where.address} has no message at commit-log offset {where.offset} "
                                f"({exc})") from None
        if msgs and msgs[0].offset_msg_id == mid:
            return msgs[0]
        not_offset_id = f"broker {where.address} holds no message starting at offset {where.offset}"
    # The classic mix-up: a producer's msgId handed where the broker's id belongs.
    if topic:
        msgs = await s.query_by_key(topic, mid, 1, 0, 0, unique_key=True)
        if msgs:
            return msgs[0]
        raise NotFoundError(f"{not_offset_id}, and no message of topic {topic!r} has it as msgId (UNIQ_KEY)")
    raise NotFoundError(f"{not_offset_id}; if it is a producer's msgId (UNIQ_KEY), use "
                        f"queryMsgByUniqueKey -t TOPIC -i {mid} (or add -t TOPIC here)")


@admin_command("sendMessage", aliases=["send-message"])
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", help="The body, as UTF-8 text.")
@click.option("--body-file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
              help="Read the body from this file ('-': standard input).")
@click.option("-k", "--key", "keys", help="Keys, space-separated.")
@click.option("-c", "--tags", help="The tag.")
@click.option("-P", "--property", "props", type=KEY_VALUE, multiple=True, help="A user property (repeatable).")
@click.option("-b", "--broker", "broker_name", help="Send to this broker (with -i).")
@click.option("-i", "--qid", "queue_id", type=click.IntRange(min=0), help="Send to this queue (with -b).")
@click.option("--delay-level", type=click.IntRange(0, 18), default=0, help="RocketMQ delay level (0: none).")
async def send_message(s: AdminSession, topic: str, body: str | None, body_file: Path | None, keys: str | None,
                       tags: str | None, props: tuple[tuple[str, str], ...], broker_name: str | None,
                       queue_id: int | None, delay_level: int) -> Result:
    """Send one message and show where it was stored."""
    if (body is None) == (body_file is None):
        raise click.UsageError("give exactly one of -p/--body and --body-file")
    if (broker_name is None) != (queue_id is None):
        raise click.UsageError("-b/--broker and -i/--qid go together")
    if body_file is not None:
        data = current_env().stdin.read() if str(body_file) == "-" else body_file.read_bytes()
    else:
        data = (body or "").encode("utf-8")
    msg = Message(topic, data, tags=tags, keys=keys, properties=dict(props), delay_level=delay_level)
    producer = await s.producer()
    queue = MessageQueue(topic=topic, broker_name=broker_name, queue_id=queue_id) if broker_name else None
    r = await producer.send(msg, queue=queue)
    data_out = {"status": r.status.value, "msgId": r.msg_id, "offsetMsgId": r.offset_msg_id, "topic": topic,
                "brokerName": r.queue.broker_name, "queueId": r.queue.queue_id, "queueOffset": r.queue_offset}
    t = table(None, ["Broker", "QID", "Queue Offset", "Status", "Msg ID", "Offset Msg ID"],
              [(r.queue.broker_name, r.queue.queue_id, r.queue_offset, r.status.value, r.msg_id, r.offset_msg_id)],
              right=["QID", "Queue Offset"])
    return Result(data_out, [t])


@admin_command("consumeMessage", aliases=["consume-message"])
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", help="Only this broker's queues.")
@click.option("-i", "--queueId", "queue_id", type=click.IntRange(min=0), help="Only this queue.")
@click.option("-o", "--offset", type=click.IntRange(min=0), help="Start here (with -i) [default: each queue's start].")
@click.option("-s", "--beginTimestamp", "begin", type=TIMESTAMP, help="Start at the first message stored then.")
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP, help="Stop at messages stored after this.")
@click.option("-c", "--MessageNumber", "count", type=click.IntRange(1, 100_000), default=128, show_default=True,
              help="At most this many messages in all.")
@click.option("-g", "--consumerGroup", "group", default=TOOLS_CONSUMER_GROUP, show_default=True,
              help="Pull as this group (offsets are never committed).")
@click.option("--tags", "tag_expr", help="Tag filter, e.g. 'TagA || TagB' (server side).")
@click.option("--sql", "sql_expr", help="SQL92 property filter (server side).")
async def consume_message(s: AdminSession, topic: str, broker_name: str | None, queue_id: int | None,
                          offset: int | None, begin: int | None, end: int | None, count: int, group: str,
                          tag_expr: str | None, sql_expr: str | None) -> Result:
    """Read messages from a topic without committing anything (a pull per queue, filtered by the broker)."""
    if tag_expr is not None and sql_expr is not None:
        raise click.UsageError("--tags and --sql exclude each other")
    if offset is not None and queue_id is None:
        raise click.UsageError("-o/--offset needs -i/--queueId")
    if offset is not None and begin is not None:
        raise click.UsageError("-o/--offset and -s/--beginTimestamp exclude each other")
    selector = MessageSelector.by_sql(sql_expr) if sql_expr is not None else MessageSelector.by_tag(tag_expr)
    queues = [q for q in await s.read_queues(topic)
              if (broker_name is None or q.broker_name == broker_name) and (queue_id is None or q.queue_id == queue_id)]
    if not queues:
        raise NotFoundError(f"topic {topic!r} has no readable queue matching the -b/-i given")
    out: list[MessageExt] = []
    for mq in queues:
        if len(out) >= count:
            break
        out += await _read_queue(s, mq, selector, group, offset, begin, end, count - len(out))
    rows = [(m.queue_id, m.queue_offset, m.msg_id, m.tags or "", " ".join(m.keys), fmt_time(m.store_timestamp),
             body_preview(m.body, 60)) for m in out]
    t = table(None, ["QID", "Offset", "Msg ID", "Tags", "Keys", "Stored", "Body"], rows, right=["QID", "Offset"])
    return Result({"topic": topic, "messages": [message_json(m) for m in out]}, [t], [f"{len(out)} message(s)"])


async def _read_queue(s: AdminSession, mq: MessageQueue, selector: MessageSelector, group: str, offset: int | None,
                      begin: int | None, end: int | None, limit: int) -> list[MessageExt]:
    addr = await s.master_addr(mq.topic, mq.broker_name)
    lo, hi = await s.min_offset(addr, mq), await s.max_offset(addr, mq)
    pos = offset if offset is not None else (await s.search_offset(addr, mq, begin) if begin else lo)
    out: list[MessageExt] = []
    while pos < hi and len(out) < limit:
        r = await s.pull(mq, selector, pos, min(PULL_BATCH, limit - len(out)), group=group)
        if r.status is PullStatus.NO_NEW_MSG or r.next_begin_offset <= pos:
            break  # the queue's end, or no progress possible
        for m in r.msg_found_list:
            if end is not None and m.store_timestamp > end:
                return out
            out.append(m)
        pos = r.next_begin_offset
    return out[:limit]
