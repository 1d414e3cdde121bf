"""``sluice admin explain``: why did (or would) consumer group G get message M?

Reads the stored message from the broker its offsetMsgId names
(VIEW_MESSAGE_BY_ID), asks that broker for the expression the group is
filtered by (GET_CONSUMER_FILTER_DATA, Sluice's request code 20001: from the
group's heartbeat, or its persisted filter data), evaluates it here with the
broker's own engine and says which predicate decided: FALSE, NULL (a missing
property) or an evaluation error, and why.
"""
from __future__ import annotations

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, kv_table
from sluice.admin.session import AdminSession
from sluice.client.broker_api import decode_messages
from sluice.errors import InvalidParameterError, NotFoundError, SluiceError
from sluice.filter import compile_selector
from sluice.protocol.codes import RequestCode
from sluice.protocol.msgid import decode_offset_msg_id


@admin_command("explain", aliases=["explainFilter"])
@click.option("-i", "--msgId", "msg_id", required=True, help="The broker's offsetMsgId of the stored message.")
@click.option("-g", "--consumerGroup", "group", required=True, help="The consumer group whose filter to explain.")
async def explain(s: AdminSession, msg_id: str, group: str) -> Result:
    """Explain whether GROUP's subscription matches the message MSGID, and which predicate decided."""
    try:
        where = decode_offset_msg_id(msg_id.strip())
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{msg_id!r} is not an offsetMsgId: {exc}") from None
    try:
        msgs = decode_messages(await s.view_message(where.address, where.offset))
    except SluiceError as exc:
        raise NotFoundError(f"broker {where.address} has no message at commit-log offset {where.offset} "
                            f"({exc})") from None
    if not msgs:
        raise NotFoundError(f"broker {where.address} holds no message at commit-log offset {where.offset}")
    msg = msgs[0]
    resp = await s.invoke(where.address, RequestCode.GET_CONSUMER_FILTER_DATA,
                          {"consumerGroup": group, "topic": msg.topic})
    report = orjson.loads(resp.body)
    subs = report.get("subscriptions") or []
    if not subs:
        raise NotFoundError(f"consumer group {group!r} has no subscription on topic {msg.topic!r}")
    sub = subs[0]
    props = dict(msg.properties)
    selector = compile_selector(sub["expressionType"], sub["expression"])
    ex = selector.explain(props)
    data = {
        "msgId": msg_id, "topic": msg.topic, "queueId": msg.queue_id, "queueOffset": msg.queue_offset,
        "group": group, "expressionType": sub["expressionType"], "expression": sub["expression"],
        "subscriptionSource": sub.get("source"), "subVersion": sub.get("subVersion"),
        "matched": ex.matched, "outcome": ex.outcome, "predicate": ex.predicate,
        "predicateOutcome": ex.predicate_outcome, "reason": ex.reason, "error": ex.error,
        "missingProperties": list(ex.missing), "properties": props,
        "conflicts": report.get("conflicts") or [],
    }
    rows = [("Message", f"{msg.topic} queue {msg.queue_id} offset {msg.queue_offset}"),
            ("Group", group), ("Expression", f"{sub['expressionType']} {sub['expression']}"),
            ("From", sub.get("source")),
            ("Delivered", "yes" if ex.matched else "no"), ("Outcome", ex.outcome)]
    if ex.predicate is not None:
        rows.append(("Decided by", f"{ex.predicate} is {ex.predicate_outcome}"))
    if ex.reason:
        rows.append(("Why", ex.reason))
    if ex.missing:
        rows.append(("Missing", ", ".join(ex.missing)))
    warnings = [c["message"] for c in data["conflicts"]]
    return Result(data, tables=[kv_table("Filter explanation", rows)], notes=[str(ex)], warnings=warnings)
