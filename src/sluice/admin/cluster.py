"""Cluster commands: clusterList, brokerStatus (GET_BROKER_CLUSTER_INFO from the namesrv, GET_BROKER_RUNTIME_INFO)."""
from __future__ import annotations

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, kv_table, table
from sluice.admin.session import AdminSession, BrokerRef, settle
from sluice.admin.status import ExitStatus
from sluice.protocol.codes import RequestCode


async def runtime_info(s: AdminSession, b: BrokerRef) -> dict[str, str]:
    resp = await s.invoke(b.addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    return dict(orjson.loads(resp.body).get("table", {}))


@admin_command("clusterList", aliases=["cluster-list"])
@click.option("-c", "--clusterName", "cluster", help="Only this cluster.")
async def cluster_list(s: AdminSession, cluster: str | None) -> Result:
    """Every broker registered with the namesrv, with its version and today's message counts."""
    brokers = await s.brokers(cluster, masters_only=False)
    outcomes = await s.gather_per_broker(brokers, lambda b: runtime_info(s, b))
    res = settle(outcomes, "GET_BROKER_RUNTIME_INFO")
    infos = dict(res.ok)
    entries, rows = [], []
    for b in brokers:
        info = infos.get(b)
        up = info is not None
        entries.append({"cluster": b.cluster, "brokerName": b.name, "brokerId": b.broker_id, "addr": b.addr,
                        "reachable": up, "runtime": info})
        g = (info or {}).get
        rows.append((b.cluster, b.name, b.broker_id, b.addr, g("brokerVersionDesc", "") if up else "UNREACHABLE",
                     g("msgPutTotalTodayNow", ""), g("msgGetTotalTodayNow", ""), g("topics", ""),
                     g("connections", ""), g("runtime", "")))
    t = table(None, ["Cluster", "Broker", "BID", "Address", "Version", "Put Today", "Got Today", "Topics",
                     "Connections", "Uptime"], rows, right=["BID", "Put Today", "Got Today", "Topics", "Connections"])
    return Result({"brokers": entries}, [t], [], res.warnings,
                  ExitStatus.PARTIAL if res.failed else ExitStatus.SUCCESS)


@admin_command("brokerStatus", aliases=["broker-status"])
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="This broker.")
@click.option("-c", "--clusterName", "cluster", help="Every broker of this cluster.")
async def broker_status(s: AdminSession, broker_addr: str | None, cluster: str | None) -> Result:
    """A broker's runtime figures (GET_BROKER_RUNTIME_INFO), one name and value a line."""
    if (broker_addr is None) == (cluster is None):
        raise click.UsageError("give exactly one of -b/--brokerAddr and -c/--clusterName")
    brokers = [await s.broker_by_addr(broker_addr)] if broker_addr else await s.brokers(cluster, masters_only=False)
    res = settle(await s.gather_per_broker(brokers, lambda b: runtime_info(s, b)), "brokerStatus")
    tables = [kv_table(f"{b.name or 'broker'} {b.addr}" if len(brokers) > 1 else None, sorted(info.items()))
              for b, info in res.ok]
    data = {b.addr: info for b, info in res.ok} if cluster else res.ok[0][1]
    return Result(data, tables, [], res.warnings, ExitStatus.PARTIAL if res.failed else ExitStatus.SUCCESS)
