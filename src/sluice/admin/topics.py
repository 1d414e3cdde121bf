"""Topic commands: updateTopic, deleteTopic, topicList, topicRoute, topicStatus."""
from __future__ import annotations

import asyncio
from typing import Any

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, fmt_time, table
from sluice.admin.session import AdminSession, BrokerRef, settle
from sluice.admin.status import ExitStatus
from sluice.errors import NotFoundError, SluiceError
from sluice.protocol import headers as H
from sluice.protocol.bodies import PERM_READ, PERM_WRITE, encode_body
from sluice.protocol.codes import RequestCode
from sluice.protocol.offset_table import decode_queue_table
from sluice.protocol.record import check_topic

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # the namesrv KV namespace of ordered topics' queue layout
#: topicList -c asks the namesrv for every topic's route: a few at a time, not thousands at once.
ROUTE_LOOKUPS_IN_FLIGHT = 16


def perm_text(perm: int) -> str:
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-")


def topic_kind(name: str, clusters: set[str] = frozenset(), brokers: set[str] = frozenset()) -> str:
    if name.startswith("%RETRY%"):
        return "retry"
    if name.startswith("%DLQ%"):
        return "dead-letter"
    # TopicValidator.isSystemTopic (the transaction topics among them)
    if name in ("TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC", "OFFSET_MOVED_EVENT",
                "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC") \
            or name in clusters or name in brokers or name.startswith("rmq_sys_"):
        return "system"
    return "normal"


async def _targets(s: AdminSession, cluster: str | None, broker_addr: str | None) -> list[BrokerRef]:
    if (cluster is None) == (broker_addr is None):
        raise click.UsageError("give exactly one of -c/--clusterName and -b/--brokerAddr")
    if broker_addr is not None:
        return [await s.broker_by_addr(broker_addr)]
    return await s.brokers(cluster)


@admin_command("updateTopic", aliases=["update-topic"])
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-c", "--clusterName", "cluster", help="Create or update on every master of this cluster.")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="Create or update on this broker only.")
@click.option("-r", "--readQueueNums", "read_queues", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-w", "--writeQueueNums", "write_queues", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-p", "--perm", type=click.Choice(["2", "4", "6"]), default="6", show_default=True,
              help="2 write only, 4 read only, 6 read and write.")
@click.option("-o", "--order", type=click.BOOL, default=False, show_default=True,
              help="An ordered topic: its queue layout is published through the namesrv.")
async def update_topic(s: AdminSession, topic: str, cluster: str | None, broker_addr: str | None, read_queues: int,
                       write_queues: int, perm: str, order: bool) -> Result:
    """Create a topic, or change its queues and permission."""
    check_topic(topic)
    brokers = await _targets(s, cluster, broker_addr)
    header = H.CreateTopicRequestHeader(topic=topic, read_queue_nums=read_queues, write_queue_nums=write_queues,
                                        perm=int(perm), order=order)
    res = settle(await s.gather_per_broker(
        brokers, lambda b: s.invoke(b.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, header)), "updateTopic")
    ok, warnings = res.ok, res.warnings
    order_conf = None
    if order:
        order_conf = await _publish_order_conf(s, topic, [b for b, _ in ok], write_queues, whole=cluster is not None)
    rows = [(b.name, b.addr, "OK") for b, _ in ok] + [(b.name, b.addr, f"FAILED: {e}") for b, e in res.failed]
    config = {"topicName": topic, "readQueueNums": read_queues, "writeQueueNums": write_queues, "perm": int(perm),
              "order": order}
    data = {"topic": topic, "config": config, "brokers": [{"brokerName": b.name, "addr": b.addr} for b, _ in ok],
            "failed": warnings, "orderConf": order_conf}
    notes = [f"topic {topic}: {read_queues} read / {write_queues} write queues, perm {perm_text(int(perm))}"
             + (f", ordered ({order_conf})" if order_conf else "")]
    return Result(data, [table(None, ["Broker", "Address", "Result"], rows)], notes, warnings,
                  ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)


async def _publish_order_conf(s: AdminSession, topic: str, brokers: list[BrokerRef], queues: int, *,
                              whole: bool) -> str:
    """createOrUpdateOrderConf: ``broker:queues;...``, replacing the whole entry for a cluster, merged for one broker."""
    ns = s.instance.namesrv
    entries: dict[str, str] = {}
    if not whole:
        for item in (await ns.get_kv(ORDER_TOPIC_CONFIG, topic) or "").split(";"):
            name, _, num = item.partition(":")
            if name and num:
                entries[name] = num
    for b in brokers:
        if b.name:
            entries[b.name] = str(queues)
    conf = ";".join(f"{k}:{v}" for k, v in sorted(entries.items()))
    await ns.put_kv(ORDER_TOPIC_CONFIG, topic, conf)
    return conf


@admin_command("deleteTopic", aliases=["delete-topic"])
@click.option("-t", "--topic", required=True)
@click.option("-c", "--clusterName", "cluster", required=True, help="Delete on every master of this cluster.")
async def delete_topic(s: AdminSession, topic: str, cluster: str) -> Result:
    """Delete a topic from a cluster's brokers and from the namesrvs (its messages age out with retention)."""
    brokers = await s.brokers(cluster)
    header = H.DeleteTopicRequestHeader(topic=topic)
    res = settle(await s.gather_per_broker(
        brokers, lambda b: s.invoke(b.addr, RequestCode.DELETE_TOPIC_IN_BROKER, header)), "deleteTopic")
    ok, warnings = res.ok, res.warnings
    await s.instance.namesrv.delete_topic(topic)
    rows = [(b.name, b.addr, "deleted") for b, _ in ok] + [(b.name, b.addr, f"FAILED: {e}") for b, e in res.failed]
    return Result({"topic": topic, "brokers": [b.name for b, _ in ok], "failed": warnings},
                  [table(None, ["Broker", "Address", "Result"], rows)], [f"topic {topic} deleted"], warnings,
                  ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)


@admin_command("topicList", aliases=["topic-list"])
@click.option("-c", "--clusterModel", "cluster_model", is_flag=True, help="Also show each topic's cluster(s).")
async def topic_list(s: AdminSession, cluster_model: bool) -> Result:
    """Every topic the namesrvs know."""
    topics = sorted(await s.instance.namesrv.get_all_topics())
    info = await s.cluster_info()
    clusters, brokers = set(info.cluster_addr_table), set(info.broker_addr_table)
    where: dict[str, list[str]] = {}
    if cluster_model:
        gate = asyncio.Semaphore(ROUTE_LOOKUPS_IN_FLIGHT)

        async def clusters_of(t: str) -> None:
            async with gate:
                try:
                    route = await s.route(t)
                except SluiceError:
                    where[t] = []
                    return
            where[t] = sorted({bd.cluster for bd in route.broker_datas})
        await asyncio.gather(*(clusters_of(t) for t in topics))
    entries = [{"topic": t, "kind": topic_kind(t, clusters, brokers),
                **({"clusters": where.get(t, [])} if cluster_model else {})} for t in topics]
    cols = ["Topic", "Kind"] + (["Cluster"] if cluster_model else [])
    rows = [[e["topic"], e["kind"]] + ([", ".join(e["clusters"])] if cluster_model else []) for e in entries]
    return Result({"topics": entries}, [table(None, cols, rows)], [f"{len(topics)} topic(s)"])


@admin_command("topicRoute", aliases=["topic-route"])
@click.option("-t", "--topic", required=True)
async def topic_route(s: AdminSession, topic: str) -> Result:
    """Which brokers serve a topic, with how many queues and what permission."""
    route = await s.route(topic)
    data: dict[str, Any] = orjson.loads(encode_body(route))
    brokers = table("Brokers", ["Broker", "Cluster", "Broker ID", "Address"],
                    [(bd.broker_name, bd.cluster, bid, addr) for bd in sorted(route.broker_datas,
                                                                             key=lambda b: b.broker_name)
                     for bid, addr in sorted(bd.broker_addrs.items())], right=["Broker ID"])
    queues = table("Queues", ["Broker", "Read Queues", "Write Queues", "Perm"],
                   [(q.broker_name, q.read_queue_nums, q.write_queue_nums, perm_text(q.perm))
                    for q in sorted(route.queue_datas, key=lambda q: q.broker_name)],
                   right=["Read Queues", "Write Queues"])
    notes = [f"ordered: {route.order_topic_conf}"] if route.order_topic_conf else []
    return Result(data, [brokers, queues], notes)


@admin_command("topicStatus", aliases=["topic-status"])
@click.option("-t", "--topic", required=True)
async def topic_status(s: AdminSession, topic: str) -> Result:
    """Each queue's offsets (min, max) and last message time, on every broker of the topic."""
    route = await s.route(topic)
    brokers = [BrokerRef(bd.cluster, bd.broker_name, 0, addr) for bd in route.broker_datas
               if (addr := bd.select_broker_addr())]
    if not brokers:
        raise NotFoundError(f"topic {topic!r} has no broker with an address in its route")
    header = H.GetTopicStatsInfoRequestHeader(topic=topic)

    async def stats(b: BrokerRef) -> list[dict[str, Any]]:
        resp = await s.invoke(b.addr, RequestCode.GET_TOPIC_STATS_INFO, header)
        return decode_queue_table(resp.body)[1]  # Sluice's list or RocketMQ's map
    res = settle(await s.gather_per_broker(brokers, stats), "topicStatus")
    ok, warnings = res.ok, res.warnings
    entries = sorted((e for _, es in ok for e in es), key=lambda e: (e["brokerName"], e["queueId"]))
    rows = [(e["brokerName"], e["queueId"], e["minOffset"], e["maxOffset"], e["maxOffset"] - e["minOffset"],
             fmt_time(e.get("lastUpdateTimestamp"))) for e in entries]
    total = sum(e["maxOffset"] - e["minOffset"] for e in entries)
    return Result({"topic": topic, "offsetTable": entries, "failed": warnings},
                  [table(None, ["Broker", "QID", "Min Offset", "Max Offset", "Messages", "Last Updated"], rows,
                         right=["QID", "Min Offset", "Max Offset", "Messages"])],
                  [f"{len(entries)} queue(s), {total} message(s) kept"], warnings,
                  ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)
