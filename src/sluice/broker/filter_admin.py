"""Wiring of server-side filtering into the broker, and its admin request.

:func:`install_filtering` is called by the BrokerController before anything
else is registered with the store: it restores the consumer filter data and
adds the bitmap dispatcher first (so records replayed by recovery get bitmaps
too). FilterAdminProcessor answers GET_CONSUMER_FILTER_DATA (Sluice's own
request code 20001):

    request fields: consumerGroup, topic (optional: every topic of the group)
    response body:  {"group": ..., "subscriptions": [{"topic", "expressionType", "expression",
                     "subVersion", "source": "heartbeat" | "filterData", "dead", "bornTime", "error"}],
                     "conflicts": [...], "metrics": {topic: {...}}}

``sluice admin explain`` uses it to find the expression a group is filtered by.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import orjson

from sluice.broker.bitmap import CalcBitmapDispatcher
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.errors import InvalidParameterError, SluiceError
from sluice.filter import BloomFilter
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection

if TYPE_CHECKING:
    from sluice.broker.controller import BrokerController

__all__ = ["install_filtering", "FilterAdminProcessor", "persist_filter_data_loop", "PERSIST_PERIOD_S"]

log = logging.getLogger(__name__)

#: consumerFilter.json is written within this long of a change (RocketMQ: every 10 s), and at shutdown:
#: changes are rare (a new, changed or dead subscription), and filter data lost in a crash would leave the
#: records replayed by recovery without bitmaps and pulls without subscription refused until the next heartbeat.
PERSIST_PERIOD_S = 1.0


def install_filtering(broker: BrokerController) -> None:
    """Create ``broker.filter_data`` / ``broker.sub_guard`` / ``broker.bitmap_dispatcher`` and hook them up."""
    c = broker.config
    bloom = BloomFilter(c.max_error_rate_of_bloom_filter, c.expect_consumer_num_use_filter)
    broker.filter_data = ConsumerFilterManager(broker.store.root / "config", bloom=bloom,
                                               clean_span_ms=c.filter_data_clean_time_span_ms)
    broker.filter_data.load()
    broker.sub_guard = SubscriptionGuard()
    broker.bitmap_dispatcher = None
    if c.enable_calc_filter_bitmap:
        broker.bitmap_dispatcher = CalcBitmapDispatcher(broker.filter_data)
        broker.store.add_dispatcher(broker.bitmap_dispatcher)


async def persist_filter_data_loop(broker: BrokerController) -> None:
    while True:
        await asyncio.sleep(PERSIST_PERIOD_S)
        try:
            fm = broker.filter_data
            doc = fm.take_snapshot()  # on the loop, where the table changes; the disk write off it
            if doc is not None:
                await broker.run_blocking(fm.write, doc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("persisting consumer filter data failed")


def group_filter_report(broker: BrokerController, group: str, topic: str | None) -> dict[str, object]:
    fm = broker.filter_data
    info = broker.consumers.get(group)
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
            "conflicts": [c.to_wire() for c in broker.sub_guard.conflicts_of(group)
                          if topic is None or c.topic == topic],
            "metrics": metrics}


class FilterAdminProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self) -> None:
        self.broker.register(RequestCode.GET_CONSUMER_FILTER_DATA, self.filter_data)

    async def filter_data(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        fields = request.ext_fields or {}
        group = fields.get("consumerGroup")
        if not group:
            raise InvalidParameterError("GET_CONSUMER_FILTER_DATA needs consumerGroup")
        body = group_filter_report(self.broker, group, fields.get("topic") or None)
        return request.make_response(body=orjson.dumps(body))
