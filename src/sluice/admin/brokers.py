"""Broker commands: getBrokerConfig, updateBrokerConfig, statsAll, brokerConsumeStats, producerConnection,
consumerStatus (mqadmin's, with its flags; tools/src/main/java/org/apache/rocketmq/tools/command/).

They read what rocketmq-dashboard reads: GET_BROKER_CONFIG / UPDATE_BROKER_CONFIG
(25/26), VIEW_BROKER_STATS_DATA (315, the minute TPS and 24-hour sums of statsAll),
GET_BROKER_CONSUME_STATS (317), GET_PRODUCER_CONNECTION_LIST (204) and
GET_CONSUMER_RUNNING_INFO (307, which the broker relays to the consumer).
"""
from __future__ import annotations

import asyncio
from typing import Any

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, fmt_time, kv_table, table
from sluice.admin.session import AdminSession, BrokerRef, settle
from sluice.admin.status import ExitStatus
from sluice.errors import NotFoundError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode
from sluice.protocol.offset_table import decode_queue_table, loads_fastjson

RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"


async def _targets(s: AdminSession, cluster: str | None, broker_addr: str | None) -> list[BrokerRef]:
    if (cluster is None) == (broker_addr is None):
        raise click.UsageError("give exactly one of -c/--clusterName and -b/--brokerAddr")
    if broker_addr is not None:
        return [await s.broker_by_addr(broker_addr)]
    return await s.brokers(cluster)


# ------------------------------------------------------------------------------------------ configuration

@admin_command("getBrokerConfig", aliases=["get-broker-config"])
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="This broker only.")
@click.option("-c", "--clusterName", "cluster", help="Every master of this cluster.")
async def get_broker_config(s: AdminSession, broker_addr: str | None, cluster: str | None) -> Result:
    """Every setting of a broker (RocketMQ's names where it has the setting), and its config version."""
    brokers = await _targets(s, cluster, broker_addr)

    async def one(b: BrokerRef) -> tuple[dict[str, str], Any]:
        resp = await s.invoke(b.addr, RequestCode.GET_BROKER_CONFIG)
        props: dict[str, str] = {}
        for line in resp.body.decode("utf-8", errors="replace").splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip():
                props[name.strip()] = value.strip()
        version = resp.ext_fields.get("version")
        try:
            return props, orjson.loads(version) if version else None
        except orjson.JSONDecodeError:
            return props, version
    res = settle(await s.gather_per_broker(brokers, one), "getBrokerConfig")
    data = {"brokers": [{"brokerName": b.name, "addr": b.addr, "version": v, "config": p} for b, (p, v) in res.ok],
            "failed": res.warnings}
    tables = [kv_table(f"{b.name or '?'} ({b.addr})", sorted(p.items())) for b, (p, _v) in res.ok]
    return Result(data, tables, [], res.warnings, ExitStatus.PARTIAL if res.failed else ExitStatus.SUCCESS)


@admin_command("updateBrokerConfig", aliases=["update-broker-config"])
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="This broker only.")
@click.option("-c", "--clusterName", "cluster", help="Every master of this cluster.")
@click.option("-a", "--updateAllBroker", "all_brokers", type=click.BOOL, default=False, show_default=True,
              help="With -c: slaves too (Sluice runs masters only).")
@click.option("-k", "--key", required=True, help="The setting (RocketMQ's name, or Sluice's snake_case one).")
@click.option("-v", "--value", required=True)
async def update_broker_config(s: AdminSession, broker_addr: str | None, cluster: str | None, all_brokers: bool,
                               key: str, value: str) -> Result:
    """Change a setting of running brokers; settings that need a restart are refused, naming them."""
    if "=" in key or "\n" in key or "\n" in value:
        raise click.UsageError("-k/--key and -v/--value are one name and one value")
    if broker_addr is not None:
        brokers = [await s.broker_by_addr(broker_addr)]
    elif cluster is not None:
        brokers = await s.brokers(cluster, masters_only=not all_brokers)
    else:
        raise click.UsageError("give -b/--brokerAddr or -c/--clusterName")
    body = f"{key}={value}\n".encode()
    res = settle(await s.gather_per_broker(
        brokers, lambda b: s.invoke(b.addr, RequestCode.UPDATE_BROKER_CONFIG, body=body)), "updateBrokerConfig")
    rows = [(b.name, b.addr, "OK") for b, _ in res.ok] + [(b.name, b.addr, f"FAILED: {e}") for b, e in res.failed]
    return Result({"key": key, "value": value, "brokers": [{"brokerName": b.name, "addr": b.addr} for b, _ in res.ok],
                   "failed": res.warnings}, [table(None, ["Broker", "Address", "Result"], rows)],
                  [f"{key}={value} on {len(res.ok)} broker(s)"], res.warnings,
                  ExitStatus.PARTIAL if res.failed else ExitStatus.SUCCESS)


# ------------------------------------------------------------------------------------------ statistics

async def stats_data(s: AdminSession, addr: str, name: str, key: str) -> dict[str, Any] | None:
    """BrokerStatsData of one statistic, or None when the broker has none for that key (mqadmin skips it)."""
    try:
        resp = await s.invoke(addr, RequestCode.VIEW_BROKER_STATS_DATA,
                              H.ViewBrokerStatsDataRequestHeader(stats_name=name, stats_key=key))
    except SluiceError:
        return None
    return orjson.loads(resp.body)


def sum_24h(bsd: dict[str, Any]) -> int:
    """StatsAllSubCommand.compute24HourSum: the day's sum, else the hour's, else the minute's."""
    for window in ("statsDay", "statsHour", "statsMinute"):
        if int(bsd[window]["sum"]):
            return int(bsd[window]["sum"])
    return 0


async def _topic_stats(s: AdminSession, topic: str, active: bool) -> list[dict[str, Any]]:
    route = await s.route(topic)
    masters = [addr for bd in route.broker_datas if (addr := bd.broker_addrs.get(0))]
    in_tps, in_24h = 0.0, 0
    for bsd in await asyncio.gather(*(stats_data(s, a, "TOPIC_PUT_NUMS", topic) for a in masters)):
        if bsd is not None:
            in_tps += float(bsd["statsMinute"]["tps"])
            in_24h += sum_24h(bsd)
    groups: set[str] = set()
    for a in masters:
        try:
            resp = await s.invoke(a, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
                                  H.QueryTopicConsumeByWhoRequestHeader(topic=topic))
            groups |= set(orjson.loads(resp.body).get("groupList", []))
        except SluiceError:
            continue
    rows = []
    for group in sorted(groups):
        out_tps, out_24h = 0.0, 0
        for bsd in await asyncio.gather(*(stats_data(s, a, "GROUP_GET_NUMS", f"{topic}@{group}") for a in masters)):
            if bsd is not None:
                out_tps += float(bsd["statsMinute"]["tps"])
                out_24h += sum_24h(bsd)
        backlog = 0
        for a in masters:
            try:
                resp = await s.invoke(a, RequestCode.GET_CONSUME_STATS,
                                      H.GetConsumeStatsRequestHeader(consumer_group=group, topic=topic))
            except SluiceError:
                continue
            backlog += sum(max(0, int(e["brokerOffset"]) - max(int(e["consumerOffset"]), 0))
                           for e in decode_queue_table(resp.body)[1])
        if not active or in_24h > 0 or out_24h > 0:
            rows.append({"topic": topic, "group": group, "accumulation": backlog, "inTps": in_tps, "outTps": out_tps,
                         "inMsg24Hour": in_24h, "outMsg24Hour": out_24h})
    if not groups and (not active or in_24h > 0):
        rows.append({"topic": topic, "group": None, "accumulation": 0, "inTps": in_tps, "outTps": None,
                     "inMsg24Hour": in_24h, "outMsg24Hour": None})
    return rows


@admin_command("statsAll", aliases=["stats-all"])
@click.option("-a", "--activeTopic", "active", is_flag=True, help="Only topics with traffic in the last 24 hours.")
@click.option("-t", "--topic", help="This topic only.")
async def stats_all(s: AdminSession, active: bool, topic: str | None) -> Result:
    """Per topic and consumer group: backlog, in/out TPS over the last minute, messages in the last 24 hours."""
    if topic is not None:
        topics = [topic]
        await s.route(topic)  # an unknown topic is an error here, not an empty table
    else:
        topics = sorted(t for t in await s.instance.namesrv.get_all_topics()
                        if not t.startswith((RETRY_PREFIX, DLQ_PREFIX)))
    rows: list[dict[str, Any]] = []
    warnings = []
    for t in topics:
        try:
            rows += await _topic_stats(s, t, active)
        except SluiceError as exc:  # a topic without a route (deleted meanwhile): mqadmin skips it too
            if topic is not None:
                raise
            warnings.append(f"topic {t}: {exc}")
    t_rows = [(r["topic"], r["group"] or "", r["accumulation"], f"{r['inTps']:.2f}",
               "" if r["outTps"] is None else f"{r['outTps']:.2f}", r["inMsg24Hour"],
               "NO_CONSUMER" if r["outMsg24Hour"] is None else r["outMsg24Hour"]) for r in rows]
    cols = ["Topic", "Consumer Group", "Accumulation", "InTPS", "OutTPS", "InMsg24Hour", "OutMsg24Hour"]
    return Result({"stats": rows}, [table(None, cols, t_rows, right=cols[2:])], [], warnings)


@admin_command("brokerConsumeStats", aliases=["broker-consume-stats"])
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", required=True)
@click.option("-t", "--timeoutMillis", "timeout_ms", type=click.IntRange(min=1), help="Request timeout in ms.")
@click.option("-l", "--level", type=click.IntRange(min=0), default=0, show_default=True,
              help="Only queues whose backlog is at least this.")
@click.option("-o", "--order", type=click.BOOL, default=False, show_default=True, help="Ordered topics only.")
async def broker_consume_stats(s: AdminSession, broker_addr: str, timeout_ms: int | None, level: int,
                               order: bool) -> Result:
    """Every group's offsets and backlog on one broker, queue by queue."""
    if timeout_ms is not None:
        s.timeout = timeout_ms / 1000.0
    resp = await s.invoke(broker_addr, RequestCode.GET_BROKER_CONSUME_STATS,
                          H.GetConsumeStatsInBrokerHeader(is_order=order))
    doc = loads_fastjson(resp.body)
    entries = []
    for item in doc.get("consumeStatsList", []):
        for group, stats in item.items():
            for cs in stats:
                _, table_ = decode_queue_table(orjson.dumps(cs))
                for e in table_:
                    diff = max(0, int(e["brokerOffset"]) - max(int(e["consumerOffset"]), 0))
                    if diff >= level:
                        entries.append({"group": group, **e, "diff": diff, "consumeTps": cs.get("consumeTps", 0.0)})
    entries.sort(key=lambda e: (e["topic"], e["group"], e["brokerName"], e["queueId"]))
    rows = [(e["topic"], e["group"], e["brokerName"], e["queueId"], e["brokerOffset"], e["consumerOffset"],
             e["diff"], fmt_time(e.get("lastTimestamp"))) for e in entries]
    cols = ["Topic", "Group", "Broker", "QID", "Broker Offset", "Consumer Offset", "Diff", "LastTime"]
    return Result({"brokerAddr": doc.get("brokerAddr", broker_addr), "totalDiff": doc.get("totalDiff", 0),
                   "offsetTable": entries},
                  [table(None, cols, rows, right=["QID", "Broker Offset", "Consumer Offset", "Diff"])],
                  [f"diff total: {doc.get('totalDiff', 0)}"])


# ------------------------------------------------------------------------------------------ clients

@admin_command("producerConnection", aliases=["producer-connection"])
@click.option("-g", "--producerGroup", "group", required=True)
@click.option("-t", "--topic", required=True, help="A topic the group sends to (its brokers are asked).")
async def producer_connection(s: AdminSession, group: str, topic: str) -> Result:
    """The producer group's live connections: client id, address, language and version."""
    route = await s.route(topic)
    brokers = [BrokerRef(bd.cluster, bd.broker_name, 0, addr) for bd in route.broker_datas
               if (addr := bd.broker_addrs.get(0))]

    async def one(b: BrokerRef) -> list[dict[str, Any]]:
        try:
            resp = await s.invoke(b.addr, RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                  H.GetProducerConnectionListRequestHeader(producer_group=group))
        except SluiceError as exc:
            # RocketMQ's broker answers SYSTEM_ERROR "the producer group[...] not exist" for a group with
            # no connection there: that broker has none, which is not a failure of the command.
            if "not exist" in str(exc):
                return []
            raise
        return list(orjson.loads(resp.body).get("connectionSet", []))
    res = settle(await s.gather_per_broker(brokers, one), "producerConnection")
    seen: dict[str, dict[str, Any]] = {}
    for _, conns in res.ok:
        for c in conns:
            seen.setdefault(str(c.get("clientId")), c)
    conns = [seen[k] for k in sorted(seen)]
    if not conns and not res.failed:  # never an empty table (docs/admin.md, exit 3)
        raise NotFoundError(f"producer group {group!r} has no live connection on the brokers of topic {topic!r}")
    rows = [(c.get("clientId"), c.get("clientAddr"), c.get("language"), c.get("version")) for c in conns]
    return Result({"group": group, "connectionSet": conns},
                  [table(None, ["Client ID", "Client Address", "Language", "Version"], rows)],
                  [f"{len(conns)} connection(s)"], res.warnings)


async def _consumer_broker(s: AdminSession, group: str, broker_addr: str | None) -> tuple[str, dict[str, Any]]:
    """A broker that knows the group online, and its GET_CONSUMER_CONNECTION_LIST answer."""
    addrs = [broker_addr] if broker_addr else [b.addr for b in await s.brokers()]
    last: SluiceError | None = None
    for addr in addrs:
        try:
            resp = await s.invoke(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                  H.GetConsumerConnectionListRequestHeader(consumer_group=group))
            return addr, orjson.loads(resp.body)
        except SluiceError as exc:
            last = exc
    raise NotFoundError(f"consumer group {group!r} is not online on any broker" + (f" ({last})" if last else ""))


@admin_command("consumerStatus", aliases=["consumer-status"])
@click.option("-g", "--consumerGroup", "group", required=True)
@click.option("-i", "--clientId", "client_id", help="This client only (every client of the group otherwise).")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="Ask through this broker.")
@click.option("-s", "--jstack", is_flag=True, help="Ask for the client's thread stacks (Java clients).")
async def consumer_status(s: AdminSession, group: str, client_id: str | None, broker_addr: str | None,
                          jstack: bool) -> Result:
    """Each consumer's own view (GET_CONSUMER_RUNNING_INFO, relayed by the broker): settings, subscriptions and
    the queues it holds with their cached messages and offsets."""
    addr, conn = await _consumer_broker(s, group, broker_addr)
    clients = sorted(str(c["clientId"]) for c in conn.get("connectionSet", []))
    if client_id is not None:
        if client_id not in clients:
            raise NotFoundError(f"client {client_id!r} is not a member of group {group!r} (members: "
                                f"{', '.join(clients) or 'none'})")
        clients = [client_id]
    out, tables, warnings = [], [], []
    for cid in clients:
        try:
            resp = await s.invoke(addr, RequestCode.GET_CONSUMER_RUNNING_INFO, H.GetConsumerRunningInfoRequestHeader(
                consumer_group=group, client_id=cid, jstack_enable=jstack))
        except SluiceError as exc:
            warnings.append(f"client {cid}: {exc}")
            continue
        doc, queues = decode_queue_table(resp.body, key="mqTable")
        doc.pop("mqTable", None)
        queues.sort(key=lambda q: (q["topic"], q["brokerName"], q["queueId"]))
        out.append({"clientId": cid, **doc, "mqTable": queues})
        props = doc.get("properties", {})
        tables.append(kv_table(f"client {cid}", sorted((k, v) for k, v in props.items())))
        tables.append(table(None, ["Topic", "Broker", "QID", "Commit Offset", "Cached", "Cached Min", "Cached Max",
                                   "Locked", "Last Pull"],
                            [(q["topic"], q["brokerName"], q["queueId"], q.get("commitOffset"),
                              q.get("cachedMsgCount"), q.get("cachedMsgMinOffset"), q.get("cachedMsgMaxOffset"),
                              q.get("locked"), fmt_time(q.get("lastPullTimestamp"))) for q in queues],
                            right=["QID", "Commit Offset", "Cached", "Cached Min", "Cached Max"]))
    if not out:
        raise SluiceError(f"no client of group {group!r} answered: " + "; ".join(warnings))
    subs = {orjson.dumps(sorted((x.get("topic"), x.get("subString")) for x in c.get("subscriptionSet", [])))
            for c in out}
    notes = [f"{len(out)} client(s) of group {group}"
             + ("; subscriptions are the same" if len(subs) == 1 else "; SUBSCRIPTIONS DIFFER between clients")]
    return Result({"group": group, "clients": out}, tables, notes, warnings,
                  ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)
