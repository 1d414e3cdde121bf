"""Server-side filtering's admin request, and the persistence of consumer filter data.

FilterAdminProcessor answers GET_CONSUMER_FILTER_DATA (Sluice's own request
code 20001):

    request fields: consumerGroup, topic (optional: every topic of the group)
    response body:  {"group": ..., "subscriptions": [{"topic", "expressionType", "expression",
                     "subVersion", "source": "heartbeat" | "filterData", "dead", "bornTime", "error"}],
                     "conflicts": [...], "metrics": {topic: {...}}}

``sluice admin explain`` uses it to find the expression a group is filtered by.
"""
from __future__ import annotations

import asyncio
import logging

import orjson

from sluice.broker.consumers import ConsumerManager
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.pool import BlockingPool
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.errors import InvalidParameterError, SluiceError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection

__all__ = ["FilterAdminProcessor", "persist_filter_data_loop", "PERSIST_PERIOD_S"]

log = logging.getLogger(__name__)

#: consumerFilter.json is written within this long of a change (RocketMQ: every 10 s), and at shutdown:
#: changes are rare (a new, changed or dead subscription), and filter data lost in a crash would leave the
#: records replayed by recovery without bitmaps and pulls without subscription refused until the next heartbeat.
PERSIST_PERIOD_S = 1.0


async def persist_filter_data_loop(fm: ConsumerFilterManager, pool: BlockingPool) -> None:
    while True:
        await asyncio.sleep(PERSIST_PERIOD_S)
        try:
            doc = fm.take_snapshot()  # on the loop, where the table changes; the disk write off it
            if doc is not None:
                await pool.run(fm.write, doc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("persisting consumer filter data failed")


def group_filter_report(fm: ConsumerFilterManager, consumers: ConsumerManager, sub_guard: SubscriptionGuard,
                        group: str, topic: str | None) -> dict[str, object]:
    info = consumers.get(group)
    subs: dict[str, dict[str, object]] = {}
    for t, by_group in fm.table.items():
        d = by_group.get(group)
        if d is not None and (topic is None or t == topic):
            subs[t] = {"topic": t, "expressionType": d.expression_type, "expression": d.expression,
                       "subVersion": d.client_version, "source": "filterData", "dead": d.is_dead,
                       "bornTime": d.born_time, "error": d.error}
    if info is not None:
        for t, s in info.subscriptions.items():
            if topic is None or t == topic:
                subs[t] = {"topic": t, "expressionType": s.expression_type, "expression": s.expression,
                           "subVersion": s.sub_version, "source": "heartbeat", "dead": False,
                           "bornTime": subs.get(t, {}).get("bornTime"), "error": None}
    if not subs:
        where = f" on topic {topic!r}" if topic else ""
        raise SluiceError(f"consumer group {group!r} has no subscription{where} on this broker "
                          "(no heartbeat and no filter data)", code=ResponseCode.QUERY_NOT_FOUND)
    metrics = {t: m.to_wire() for (g, t), m in fm.metrics.items() if g == group and (topic is None or t == topic)}
    return {"group": group, "subscriptions": [subs[t] for t in sorted(subs)],
            "conflicts": [c.to_wire() for c in sub_guard.conflicts_of(group)
                          if topic is None or c.topic == topic],
            "metrics": metrics}


class FilterAdminProcessor:
    def __init__(self, *, filter_data: ConsumerFilterManager, consumers: ConsumerManager,
                 sub_guard: SubscriptionGuard) -> None:
        self.fm = filter_data
        self.consumers = consumers
        self.sub_guard = sub_guard

    async def filter_data(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        fields = request.ext_fields or {}
        group = fields.get("consumerGroup")
        if not group:
            raise InvalidParameterError("GET_CONSUMER_FILTER_DATA needs consumerGroup")
        body = group_filter_report(self.fm, self.consumers, self.sub_guard, group, fields.get("topic") or None)
        return request.make_response(body=orjson.dumps(body))
