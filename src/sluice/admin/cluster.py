"""Cluster commands: clusterList, brokerStatus (GET_BROKER_CLUSTER_INFO from the namesrv, GET_BROKER_RUNTIME_INFO),
wipeWritePerm and addWritePerm (WIPE_WRITE_PERM_OF_BROKER / ADD_WRITE_PERM_OF_BROKER to every namesrv)."""
from __future__ import annotations

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, kv_table, table
from sluice.admin.session import AdminSession, BrokerRef, settle
from sluice.admin.status import ExitStatus
from sluice.errors import NotFoundError, SluiceError
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


async def _write_perm(s: AdminSession, broker_name: str, writable: bool) -> Result:
    info = await s.cluster_info()
    if broker_name not in info.broker_addr_table:
        known = ", ".join(sorted(info.broker_addr_table)) or "none"
        raise NotFoundError(f"broker {broker_name!r} is not registered with the namesrv (known: {known})")
    outcomes = await s.instance.namesrv.change_write_perm(broker_name, writable=writable)
    verb = "add" if writable else "wipe"
    ok = [(addr, n) for addr, n in outcomes if not isinstance(n, SluiceError)]
    failed = [f"namesrv {addr}: {e}" for addr, e in outcomes if isinstance(e, SluiceError)]
    if not ok:
        raise SluiceError(f"{verb} write perm of broker {broker_name} failed on every namesrv: " + "; ".join(failed))
    rows = [(addr, "OK", n) for addr, n in ok] + [(addr, f"FAILED: {e}", "") for addr, e in outcomes
                                                  if isinstance(e, SluiceError)]
    return Result({"brokerName": broker_name, "namesrvs": [{"addr": a, "topicCount": n} for a, n in ok],
                   "failed": failed},
                  [table(None, ["Namesrv", "Result", "Topics"], rows, right=["Topics"])],
                  [f"{verb} write perm of broker {broker_name}: " + ", ".join(f"{n} topic(s) on {a}" for a, n in ok)
                   + ("" if writable else " (the broker takes no sends through these routes now)")],
                  failed, ExitStatus.PARTIAL if failed else ExitStatus.SUCCESS)


@admin_command("wipeWritePerm", aliases=["wipe-write-perm"])
@click.option("-b", "--brokerName", "broker_name", required=True)
async def wipe_write_perm(s: AdminSession, broker_name: str) -> Result:
    """Take write permission from a broker in every namesrv's routes (drain it before maintenance)."""
    return await _write_perm(s, broker_name, False)


@admin_command("addWritePerm", aliases=["add-write-perm"])
@click.option("-b", "--brokerName", "broker_name", required=True)
async def add_write_perm(s: AdminSession, broker_name: str) -> Result:
    """Give a broker its write permission back in every namesrv's routes."""
    return await _write_perm(s, broker_name, True)
