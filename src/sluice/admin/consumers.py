"""Consumer-group commands: consumerProgress, consumerConnection, resetOffsetByTime.

consumerProgress shows two lags per queue: ``Lag`` (messages after the
committed offset) and ``Matching Lag`` (those the group's subscription will
actually deliver). A Sluice broker counts the latter (``filteredLag`` in each
GET_CONSUME_STATS entry, ``filteredLagExact`` false when its work bound was hit
and the count is a lower bound, shown ``≥N``). A broker that does not count
(RocketMQ) leaves the column at the plain lag, marked ``*``. In JSON,
``matchingLag`` and ``matchingLagBasis`` (``counted``, ``at-least``,
``plain-lag``) say the same. A class-filter group's matches are not counted
(its class runs in the filter servers): plain lag, marked. The members' class-filter
errors (the class and the cause, from their heartbeats) are warnings.
"""
from __future__ import annotations

from typing import Any

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, fmt_time, table
from sluice.admin.params import TimestampType
from sluice.admin.session import AdminSession, BrokerRef, settle
from sluice.admin.status import CONSUMER_NOT_ONLINE, ExitStatus
from sluice.errors import NotFoundError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode
from sluice.protocol.offset_table import decode_queue_table

RETRY_PREFIX = "%RETRY%"


# ------------------------------------------------------------------------------------------ consumerProgress

async def consume_stats(s: AdminSession, group: str, topic: str | None,
                        filter_stats: dict[str, Any] | None = None, class_errors: list[dict[str, Any]] | None = None,
                        ) -> tuple[list[dict[str, Any]], float, list[str]]:
    """Every master's GET_CONSUME_STATS entries for ``group``, the summed consume TPS, and warnings;
    the brokers' per-topic filter figures (``filterStats``) go into ``filter_stats`` by broker name, the
    members' class-filter errors (``classFilterErrors``) into ``class_errors``."""
    header = H.GetConsumeStatsRequestHeader(consumer_group=group, topic=topic)

    async def one(b: BrokerRef) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return decode_queue_table((await s.invoke(b.addr, RequestCode.GET_CONSUME_STATS, header)).body)
    res = settle(await s.gather_per_broker(await s.brokers(), one), "GET_CONSUME_STATS")
    entries = []
    warnings = list(res.warnings)
    for b, (body, table_) in res.ok:
        if filter_stats is not None and body.get("filterStats"):
            filter_stats[b.name or b.addr] = body["filterStats"]
        for e in table_:
            if "lag" not in e:  # RocketMQ's OffsetWrapper has only the two offsets
                e["lag"] = max(0, int(e["brokerOffset"]) - max(int(e["consumerOffset"]), 0))
            if "filteredLag" in e:
                basis = "counted" if e.get("filteredLagExact", True) else "at-least"
                entries.append({**e, "matchingLag": int(e["filteredLag"]), "matchingLagBasis": basis})
            else:
                entries.append({**e, "matchingLag": e["lag"], "matchingLagBasis": "plain-lag"})
        for c in body.get("subscriptionConflicts", []):
            warnings.append(f"subscription conflict in group {group}: {_conflict_text(c)}")
        for c in body.get("classFilterErrors", []):  # reported by the members' heartbeats (class filters)
            if topic is not None and c.get("topic") != topic:
                continue
            text = (f"class filter error in group {group} on topic {c.get('topic')} (client {c.get('clientId')}): "
                    f"{c.get('error')}")
            if text not in warnings:
                warnings.append(text)
                if class_errors is not None:
                    class_errors.append({**c, "brokerName": b.name or b.addr})
    entries.sort(key=lambda e: (e["topic"], e["brokerName"], e["queueId"]))
    tps = sum(float(body.get("consumeTps", 0.0)) for _, (body, _t) in res.ok)
    return entries, tps, warnings


def filter_notes(filters: dict[str, Any]) -> list[str]:
    """One line per broker and filtered topic: the expression and the broker's evaluation counters."""
    out = []
    for broker, topics in sorted(filters.items()):
        for t, st in sorted(topics.items()):
            if not isinstance(st, dict) or not st.get("expression") or st.get("expression") == "*":
                continue
            counters = ", ".join(f"{k} {v}" for k, v in st.items()
                                 if k not in ("expression", "expressionType", "subVersion", "dead") and v is not None)
            out.append(f"filter {st.get('expressionType') or ''} {st['expression']!r} on {t} at {broker}"
                       + (f": {counters}" if counters else ""))
    return out


def _conflict_text(c: Any) -> str:
    if isinstance(c, dict):
        return ", ".join(f"{k}={v}" for k, v in c.items())
    return str(c)


def matching_text(value: int, basis: str) -> str:
    return f"≥{value}" if basis == "at-least" else f"{value}{'*' if basis == 'plain-lag' else ''}"


def total_basis(entries: list[dict[str, Any]]) -> str:
    bases = {e["matchingLagBasis"] for e in entries}
    return "plain-lag" if "plain-lag" in bases else ("at-least" if "at-least" in bases else "counted")


@admin_command("consumerProgress", aliases=["consumer-progress"])
@click.option("-g", "--groupName", "group", help="The consumer group (all groups when omitted).")
@click.option("-t", "--topic", help="Only this topic of the group.")
async def consumer_progress(s: AdminSession, group: str | None, topic: str | None) -> Result:
    """Per queue: broker offset, committed offset, lag and matching lag (what the group will actually get)."""
    if group is None:
        if topic is not None:
            raise click.UsageError("-t/--topic needs -g/--groupName")
        return await _all_groups(s)
    filters: dict[str, Any] = {}
    class_errors: list[dict[str, Any]] = []
    entries, tps, warnings = await consume_stats(s, group, topic, filters, class_errors)
    if not entries:
        what = f"topic {topic!r} of group {group!r}" if topic else f"group {group!r}"
        raise NotFoundError(f"{what}: no committed offset and no online subscription on any broker")
    total = sum(e["lag"] for e in entries)
    matching = sum(e["matchingLag"] for e in entries)
    basis = total_basis(entries)
    rows = [(e["topic"], e["brokerName"], e["queueId"], e["brokerOffset"],
             e["consumerOffset"] if e["consumerOffset"] >= 0 else "-", e["lag"],
             matching_text(e["matchingLag"], e["matchingLagBasis"]), fmt_time(e.get("lastTimestamp")))
            for e in entries]
    t = table(None, ["Topic", "Broker", "QID", "Broker Offset", "Consumer Offset", "Lag", "Matching Lag",
                     "Last Consumed"], rows, right=["QID", "Broker Offset", "Consumer Offset", "Lag", "Matching Lag"])
    notes = [f"group {group}: total lag {total}, matching lag {matching_text(matching, basis)}, "
             f"consume TPS {tps:.1f}"]
    if basis == "plain-lag":
        notes.append("* the broker does not count matching messages: the plain lag is shown")
    elif basis == "at-least":
        notes.append("≥ the broker stopped counting at its work bound: at least this many match")
    notes += filter_notes(filters)
    data = {"group": group, "offsetTable": entries, "totalLag": total, "totalMatchingLag": matching,
            "matchingLagBasis": basis, "consumeTps": tps, "filterStats": filters, "classFilterErrors": class_errors}
    return Result(data, [t], notes, warnings, ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)


async def _all_groups(s: AdminSession) -> Result:
    """mqadmin's consumerProgress without -g: the groups are the ones with a %RETRY% topic."""
    groups = sorted(t[len(RETRY_PREFIX):] for t in await s.instance.namesrv.get_all_topics()
                    if t.startswith(RETRY_PREFIX))
    out, warnings = [], []
    for g in groups:
        entries, tps, warn = await consume_stats(s, g, None)
        warnings += warn
        conn = await _connections(s, g)
        out.append({"group": g, "clients": len(conn["connectionSet"]) if conn else 0,
                    "consumeType": conn.get("consumeType") if conn else None,
                    "messageModel": conn.get("messageModel") if conn else None, "consumeTps": tps,
                    "totalLag": sum(e["lag"] for e in entries),
                    "totalMatchingLag": sum(e["matchingLag"] for e in entries),
                    "matchingLagBasis": total_basis(entries)})
    rows = [(o["group"], o["clients"], o["consumeType"] or "", o["messageModel"] or "", f"{o['consumeTps']:.1f}",
             o["totalLag"], matching_text(o["totalMatchingLag"], o["matchingLagBasis"])) for o in out]
    t = table(None, ["Group", "Clients", "Type", "Model", "TPS", "Lag", "Matching Lag"], rows,
              right=["Clients", "TPS", "Lag", "Matching Lag"])
    return Result({"groups": out}, [t], [f"{len(out)} group(s)"], warnings,
                  ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)


# ------------------------------------------------------------------------------------------ consumerConnection

async def _connections(s: AdminSession, group: str) -> dict[str, Any] | None:
    """The group's connections merged over all masters; None when no broker has it online."""
    header = H.GetConsumerConnectionListRequestHeader(consumer_group=group)

    async def one(b: BrokerRef) -> dict[str, Any] | None:
        try:
            resp = await s.invoke(b.addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, header)
        except SluiceError as exc:
            if exc.code == CONSUMER_NOT_ONLINE:
                return None
            raise
        return dict(orjson.loads(resp.body))
    res = settle(await s.gather_per_broker(await s.brokers(), one), "GET_CONSUMER_CONNECTION_LIST")
    found = [body for _, body in res.ok if body]
    if not found:
        return None
    merged = dict(found[0])
    clients = {c["clientId"]: c for body in found for c in body.get("connectionSet", [])}
    merged["connectionSet"] = [clients[k] for k in sorted(clients)]
    subs: dict[str, Any] = {}
    for body in found:
        subs.update(body.get("subscriptionTable", {}))
    merged["subscriptionTable"] = subs
    return merged


@admin_command("consumerConnection", aliases=["consumer-connection"])
@click.option("-g", "--consumerGroup", "group", required=True)
async def consumer_connection(s: AdminSession, group: str) -> Result:
    """The group's online clients and what they subscribe to."""
    conn = await _connections(s, group)
    if conn is None:
        raise NotFoundError(f"consumer group {group!r} is not online on any broker")
    clients = table("Clients", ["Client ID", "Address", "Language", "Version"],
                    [(c["clientId"], c.get("clientAddr", ""), c.get("language", ""), c.get("version", ""))
                     for c in conn["connectionSet"]])
    subs = table("Subscriptions", ["Topic", "Type", "Expression"],
                 [(t, "CLASS" if sd.get("classFilterMode") else sd.get("expressionType", "TAG"),
                   sd.get("subString", "")) for t, sd in sorted(conn["subscriptionTable"].items())])
    notes = [f"consume type {conn.get('consumeType')}, model {conn.get('messageModel')}, "
             f"from {conn.get('consumeFromWhere')}"]
    return Result({"group": group, **conn}, [clients, subs], notes)


# ------------------------------------------------------------------------------------------ resetOffsetByTime

@admin_command("resetOffsetByTime", aliases=["reset-offset-by-time"])
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-s", "--timestamp", type=TimestampType(words=True),
              help="ms, now, earliest, latest, yyyy-MM-dd#HH:mm:ss:SSS or ISO 8601.")
@click.option("-o", "--offset", type=click.IntRange(min=0), help="An explicit offset instead (needs -q).")
@click.option("-q", "--queue", "queue_id", type=click.IntRange(min=0), help="Only this queue.")
@click.option("-b", "--brokerName", "broker_name", help="Only the queues of this broker.")
@click.option("-f", "--force", type=click.BOOL, default=True, show_default=True,
              help="Move forward too; false only moves offsets back.")
@click.option("-c", "--cplus", is_flag=True, hidden=True, help="Accepted for mqadmin compatibility; no effect.")
async def reset_offset_by_time(s: AdminSession, group: str, topic: str, timestamp: int | None, offset: int | None,
                               queue_id: int | None, broker_name: str | None, force: bool, cplus: bool) -> Result:
    """Move a group's committed offsets to a time (or an offset), online or offline, back or forward."""
    if (timestamp is None) == (offset is None):
        raise click.UsageError("give exactly one of -s/--timestamp and -o/--offset")
    if offset is not None and queue_id is None:
        raise click.UsageError("-o/--offset needs -q/--queue (offsets are per queue)")
    route = await s.route(topic)
    brokers = [BrokerRef(bd.cluster, bd.broker_name, 0, addr) for bd in sorted(route.broker_datas,
                                                                              key=lambda x: x.broker_name)
               if (addr := bd.broker_addrs.get(0)) and (broker_name is None or bd.broker_name == broker_name)]
    if not brokers:
        raise NotFoundError(f"topic {topic!r} has no master broker" + (f" named {broker_name!r}" if broker_name
                                                                       else ""))
    header = H.ResetOffsetRequestHeader(topic=topic, group=group, timestamp=-1 if timestamp is None else timestamp,
                                        is_force=force, queue_id=queue_id, offset=offset)

    async def one(b: BrokerRef) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        # Sluice answers old and new offsets; a RocketMQ broker its fastjson ResetOffsetBody (new offsets only).
        return decode_queue_table((await s.invoke(b.addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header)).body)
    res = settle(await s.gather_per_broker(brokers, one), "resetOffsetByTime")
    entries = sorted((e for _, (_b, table_) in res.ok for e in table_), key=lambda e: (e["brokerName"], e["queueId"]))
    notified = sorted({c for _, (body, _t) in res.ok for c in body.get("notifiedClients", [])})

    def moved(e: dict[str, Any]) -> str:
        prev = e.get("previousOffset")
        return "" if prev is None or prev < 0 else f"{e['offset'] - prev:+d}"
    rows = [(e["brokerName"], e["queueId"], "-" if e.get("previousOffset") in (None, -1) else e["previousOffset"],
             e["offset"], moved(e)) for e in entries]
    t = table(None, ["Broker", "QID", "Old Offset", "New Offset", "Moved"], rows,
              right=["QID", "Old Offset", "New Offset", "Moved"])
    notes = [f"group {group} on {topic}: {len(entries)} queue(s) reset; "
             + (f"told {len(notified)} online client(s)" if notified else "no client online")]
    return Result({"group": group, "topic": topic, "offsetTable": entries, "notifiedClients": notified,
                   "failed": res.warnings}, [t], notes, res.warnings,
                  ExitStatus.PARTIAL if res.failed else ExitStatus.SUCCESS)
