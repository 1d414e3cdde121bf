"""Filter-aware lag: how many of the messages between a group's committed offset and the end of a queue
its subscription actually matches (what GET_CONSUME_STATS reports as ``filteredLag``).

Units are scanned in batches: a tag subscription is decided on tag codes
alone (exact); a SQL92 subscription with Bloom data rules units out on their
bitmaps and evaluates the records of the rest; without Bloom data every record
is evaluated. The work per call is bounded (units and record reads); when a
bound is hit the count is a lower bound and ``filteredLagExact`` is false
(consumerProgress shows "≥N").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sluice.broker.consumers import ConsumerManager
from sluice.broker.filter_data import LIVE_MARGIN_MS, ConsumerFilterManager
from sluice.broker.filtering import SelectorFilter
from sluice.broker.sub_conflicts import SubscriptionGuard
from sluice.protocol import properties as P
from sluice.store.commitlog import parse_record
from sluice.store.consumequeue import PAD_SIZE
from sluice.store import MessageStore
from sluice.store.ext_files import resolve_units

__all__ = ["LagBudget", "group_filter", "matching_count", "consume_stats_extras"]

_BATCH = 1 << 14


@dataclass(slots=True)
class LagBudget:
    """What one GET_CONSUME_STATS call may spend on filtered lag, across all its queues."""

    units: int = 2_000_000
    records: int = 20_000


def group_filter(consumers: ConsumerManager, fm: ConsumerFilterManager, group: str, topic: str
                 ) -> SelectorFilter | None:
    """The group's filter for ``topic`` without metrics (None: it takes every message).

    From its heartbeat subscription, else its restored filter data; raises LookupError when the broker
    knows neither."""
    info = consumers.get(group)
    sub = info.subscriptions.get(topic) if info is not None else None
    fd = fm.get(topic, group)
    if sub is not None:
        base = sub.filter
    elif fd is not None and fd.selector is not None:
        base = SelectorFilter(fd.selector)
    else:
        raise LookupError(topic)
    if base.passes_all:
        return None
    if fd is not None and fd.is_sql and fd.selector is not None and fd.expression == base.selector.expression:
        return base.for_pull(None, fm.bloom, fd.bloom, fd.born_time + LIVE_MARGIN_MS)
    return base.for_pull(None)


def matching_count(store: MessageStore, topic: str, qid: int, start: int, end: int,
                   mf: SelectorFilter | None, budget: LagBudget) -> tuple[int, bool]:
    """(messages in queue offsets [start, end) that ``mf`` matches, exact?) within ``budget``."""
    cq = store.queues.get(topic, qid)
    if cq is None or end <= start:
        return 0, True
    start = max(start, cq.min_offset)
    if mf is None:
        return max(0, end - start), True
    ext = store.ext.get(topic, qid)
    count, pos = 0, start
    cl = store.commitlog
    while pos < end:
        if budget.units <= 0:
            return count, False
        units = cq.get_units(pos, min(_BATCH, end - pos, budget.units))
        if units is None or len(units) == 0:
            break
        budget.units -= len(units)
        real = (units["size"] > 0) & (units["size"] != PAD_SIZE)
        codes, batch, unresolved = resolve_units(ext, units["tag"])
        mask, check = mf.select_units(codes, batch, unresolved)
        wanted = real if mask is None else real & mask
        direct = wanted if check is None else wanted & ~check
        count += int(np.count_nonzero(direct))
        if check is not None:
            for i in np.flatnonzero(wanted & check).tolist():
                if budget.records <= 0:
                    return count, False
                budget.records -= 1
                data = cl.read(int(units["offset"][i]), int(units["size"][i]))
                if data is None:
                    continue
                props = P.decode_properties(parse_record(data, 0, check_crc=False).properties)
                if mf.match_record(props):
                    count += 1
        pos += len(units)
    return count, True


def consume_stats_extras(store: MessageStore, consumers: ConsumerManager, fm: ConsumerFilterManager,
                         sub_guard: SubscriptionGuard, group: str, entries: list[dict]) -> dict[str, object]:
    """Add ``filteredLag`` / ``filteredLagExact`` to each GET_CONSUME_STATS entry; return the top-level
    extras (``totalFilteredLag``, ``filterStats`` per topic, ``subscriptionConflicts``, ``classFilterErrors``).
    A class-filter topic's entries get no ``filteredLag``: its class runs in the filter servers, so the
    broker cannot count its matches (consumerProgress shows the plain lag, marked)."""
    budget = LagBudget()
    info = consumers.get(group)
    filters: dict[str, SelectorFilter | None | LookupError] = {}
    total, exact_all = 0, True
    for e in entries:
        topic = e["topic"]
        sub = info.subscriptions.get(topic) if info is not None else None
        if sub is not None and sub.expression_type == "CLASS":
            continue
        if topic not in filters:
            try:
                filters[topic] = group_filter(consumers, fm, group, topic)
            except LookupError as err:
                filters[topic] = err
        mf = filters[topic]
        if isinstance(mf, LookupError):  # no subscription known: every message counts, as in plain lag
            n, exact = e["lag"], True
        else:
            consumer = e["consumerOffset"]
            start = consumer if consumer >= 0 else store.get_min_offset(topic, e["queueId"])
            n, exact = matching_count(store, topic, e["queueId"], start, e["brokerOffset"], mf, budget)
        e["filteredLag"] = n
        e["filteredLagExact"] = exact
        total += n
        exact_all &= exact
    stats = {}
    for topic in sorted({e["topic"] for e in entries} | {t for (g, t) in fm.metrics if g == group}):
        fd = fm.get(topic, group)
        m = fm.metrics.get((group, topic))
        stats[topic] = {
            "expressionType": fd.expression_type if fd else None, "expression": fd.expression if fd else None,
            "subVersion": fd.client_version if fd else None, "dead": fd.is_dead if fd else None,
            **(m.to_wire() if m is not None else {}),
        }
    return {"totalFilteredLag": total, "totalFilteredLagExact": exact_all, "filterStats": stats,
            "subscriptionConflicts": [c.to_wire() for c in sub_guard.conflicts_of(group)],
            "classFilterErrors": info.class_filter_errors() if info is not None else []}
