"""queryMsgTraceById: a message's path (sent, consumed by each group) from the trace topic.

As mqadmin's QueryMsgTraceByIdSubCommand
(tools/src/main/java/org/apache/rocketmq/tools/command/message/QueryMsgTraceByIdSubCommand.java): the
trace topic is queried by the msgId key, each trace message's body is decoded (sluice.protocol.trace,
RocketMQ's TraceDataEncoder format, so traces written by RocketMQ's Java client read the same) and the
records of that msgId are shown: the producer's rows (Pub, with its message type, and a transactional
producer's EndTransaction rows, whose status is the transaction state, "by check" when it answered the broker's
check), then one table per consumer group with its SubBefore and SubAfter rows. (mqadmin prints Pub and SubAfter
rows only.) The client host is the trace message's born host (TraceView.decodeFromTraceTransData).
A SubAfter written by an older client carries no group or time; it takes them from the SubBefore of the
same request id.
"""
from __future__ import annotations

from typing import Any

import click

from sluice.admin.core import admin_command
from sluice.admin.output import Result, fmt_time, table
from sluice.admin.params import TIMESTAMP
from sluice.admin.session import AdminSession
from sluice.errors import NotFoundError, TopicNotExistError
from sluice.protocol.trace import MESSAGE_TYPES, TRACE_TOPIC, TraceFormatError, TraceType, decode_traces

_ORDER = {TraceType.Pub: 0, TraceType.SubBefore: 1, TraceType.SubAfter: 2, TraceType.EndTransaction: 3}


def _views(msg_id: str, found: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """TraceView.decodeFromTraceTransData over the trace messages found: the records of ``msg_id``, and a
    warning for each trace message whose body does not decode."""
    views: list[dict[str, Any]] = []
    warnings = []
    for m in found:
        try:
            contexts = decode_traces(m.body)
        except TraceFormatError as exc:
            warnings.append(f"trace message {m.msg_id} skipped: {exc}")
            continue
        host = m.born_host[0]  # getBornHostString: the address without the port
        for c in contexts:
            b = c.beans[0]
            if b.msg_id != msg_id:
                continue
            views.append({
                "type": c.trace_type.value, "group": c.group, "clientHost": b.client_host or host,
                "timestamp": c.timestamp, "costTime": c.cost_time,
                "status": None if c.trace_type is TraceType.SubBefore else ("success" if c.success else "failed"),
                "topic": b.topic, "tags": b.tags, "keys": b.keys, "storeHost": b.store_host,
                "offsetMsgId": b.offset_msg_id, "bodyLength": b.body_length, "msgType": b.msg_type,
                "retryTimes": b.retry_times, "requestId": c.request_id, "contextCode": c.context_code,
                "regionId": c.region_id, "traceMsgId": m.msg_id})
            if c.trace_type is TraceType.EndTransaction:
                views[-1].update(status=b.transaction_state, transactionState=b.transaction_state,
                                 transactionId=b.transaction_id, fromTransactionCheck=b.from_transaction_check)
    before = {v["requestId"]: v for v in views if v["type"] == TraceType.SubBefore.value}
    for v in views:
        if v["type"] == TraceType.SubAfter.value and (b4 := before.get(v["requestId"])) is not None:
            v["group"] = v["group"] or b4["group"]
            v["timestamp"] = v["timestamp"] or b4["timestamp"]
    views.sort(key=lambda v: (_ORDER[TraceType(v["type"])] > 0, v["timestamp"], _ORDER[TraceType(v["type"])]))
    return views, warnings


@admin_command("queryMsgTraceById", aliases=["query-msg-trace-by-id"])
@click.option("-i", "--msgId", "msg_id", required=True, help="The producer's msgId (UNIQ_KEY).")
@click.option("-t", "--traceTopic", "trace_topic", default=TRACE_TOPIC, show_default=True,
              help="The topic the clients traced into.")
@click.option("-b", "--beginTimestamp", "begin", type=TIMESTAMP, default=0, help="Traced at or after [default: any].")
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP, default=0, help="Traced at or before [default: any].")
@click.option("-c", "--maxNum", "max_num", type=click.IntRange(1, 64), default=64, show_default=True,
              help="Trace messages read at most.")
async def query_msg_trace_by_id(s: AdminSession, msg_id: str, trace_topic: str, begin: int, end: int,
                                max_num: int) -> Result:
    """A message's trace: who sent it and when, and each consumer group's consumption of it."""
    msg_id = msg_id.strip()
    try:
        found = await s.query_by_key(trace_topic, msg_id, max_num, begin, end, unique_key=False)
    except TopicNotExistError:
        raise NotFoundError(f"trace topic {trace_topic!r} does not exist: no client traced into it yet "
                            f"(enable_trace=True), or the broker's trace_topic_enable is off") from None
    views, warnings = _views(msg_id, found)
    if not views:
        raise NotFoundError(f"no trace of msgId {msg_id!r} in topic {trace_topic!r}")
    pubs = [v for v in views if v["type"] in (TraceType.Pub.value, TraceType.EndTransaction.value)]
    tables = []
    if pubs:
        tables.append(table(None, ["Type", "ProducerGroup", "ClientHost", "SendTime", "CostTimes", "Status",
                                   "MsgType"],
                            [(v["type"], v["group"], v["clientHost"], fmt_time(v["timestamp"]),
                              "" if v["type"] == TraceType.EndTransaction.value else f"{v['costTime']}ms",
                              v["status"] + (" by check" if v.get("fromTransactionCheck") else ""),
                              MESSAGE_TYPES.get(v["msgType"], v["msgType"])) for v in pubs], right=["CostTimes"]))
    groups: dict[str, list[dict[str, Any]]] = {}
    for v in views:
        if v["type"] in (TraceType.SubBefore.value, TraceType.SubAfter.value):
            groups.setdefault(v["group"], []).append(v)
    for rows in groups.values():
        tables.append(table(None, ["Type", "ConsumerGroup", "ClientHost", "ConsumeTime", "CostTimes", "Status",
                                   "RetryTimes"],
                            [(v["type"], v["group"], v["clientHost"], fmt_time(v["timestamp"]),
                              "" if v["type"] == TraceType.SubBefore.value else f"{v['costTime']}ms",
                              v["status"] or "", v["retryTimes"] if v["type"] == TraceType.SubBefore.value else "")
                             for v in rows], right=["CostTimes", "RetryTimes"]))
    consumed = sum(1 for v in views if v["type"] == TraceType.SubAfter.value and v["status"] == "success")
    sends = sum(1 for v in pubs if v["type"] == TraceType.Pub.value)
    ends = f", {len(pubs) - sends} transaction end(s)" if len(pubs) > sends else ""
    return Result({"msgId": msg_id, "traceTopic": trace_topic, "traces": views}, tables,
                  [f"{len(views)} trace record(s) of {msg_id}: {sends} send(s){ends}, {len(groups)} consumer "
                   f"group(s), {consumed} successful consumption(s)"], warnings)
