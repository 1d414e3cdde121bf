"""Subscription group commands: updateSubGroup, deleteSubGroup (mqadmin's flags).

As mqadmin's UpdateSubGroupSubCommand, updateSubGroup writes a whole
SubscriptionGroupConfig: the flags given, the defaults for the rest (the
broker fills them: RocketMQ's defaults, retryMaxTimes from its
``max_reconsume_times``), so a setting left out returns to its default.
"""
from __future__ import annotations

from typing import Any

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, table
from sluice.admin.session import AdminSession, BrokerRef, settle
from sluice.admin.status import ExitStatus
from sluice.errors import InvalidParameterError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode

#: flag value -> SubscriptionGroupConfig JSON name (broker/subgroups.py FIELDS)
_WIRE = {"consume_enable": "consumeEnable", "consume_from_min_enable": "consumeFromMinEnable",
         "consume_broadcast_enable": "consumeBroadcastEnable", "retry_queue_nums": "retryQueueNums",
         "retry_max_times": "retryMaxTimes", "broker_id": "brokerId",
         "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
         "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable"}
_COUNT = click.IntRange(0, 2**31 - 1)


async def _targets(s: AdminSession, cluster: str | None, broker_addr: str | None) -> list[BrokerRef]:
    if (cluster is None) == (broker_addr is None):
        raise click.UsageError("give exactly one of -c/--clusterName and -b/--brokerAddr")
    if broker_addr is not None:
        return [await s.broker_by_addr(broker_addr)]
    return await s.brokers(cluster)


def _check_group(group: str) -> None:
    # The broker checks too (broker/subgroups.py check_group); refusing here names the flag.
    if not group or len(group) > 255 or any(not (c.isascii() and (c.isalnum() or c in "%|_-")) for c in group):
        raise InvalidParameterError(f"-g/--groupName {group!r}: a group name is 1..255 characters of "
                                    "[%|a-zA-Z0-9_-]")


@admin_command("updateSubGroup", aliases=["update-sub-group"])
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="Create or update on this broker only.")
@click.option("-c", "--clusterName", "cluster", help="Create or update on every master of this cluster.")
@click.option("-g", "--groupName", "group", required=True, help="The consumer group.")
@click.option("-s", "--consumeEnable", "consume_enable", type=click.BOOL,
              help="Consuming allowed (false: the group's pulls are refused) [default: true].")
@click.option("-m", "--consumeFromMinEnable", "consume_from_min_enable", type=click.BOOL,
              help="Kept for RocketMQ compatibility [default: true].")
@click.option("-d", "--consumeBroadcastEnable", "consume_broadcast_enable", type=click.BOOL,
              help="Broadcasting consumers allowed [default: true].")
@click.option("-q", "--retryQueueNums", "retry_queue_nums", type=click.IntRange(0, 1024),
              help="Queues of the group's retry topic (0: failed messages go to the DLQ at once) [default: 1].")
@click.option("-r", "--retryMaxTimes", "retry_max_times", type=_COUNT,
              help="Deliveries before the DLQ, when the client names no limit [default: the broker's, 16].")
@click.option("-i", "--brokerId", "broker_id", type=_COUNT, help="Kept for RocketMQ compatibility [default: 0].")
@click.option("-w", "--whichBrokerWhenConsumeSlowly", "which_broker_when_consume_slowly", type=_COUNT,
              help="Kept for RocketMQ compatibility [default: 1].")
@click.option("-a", "--notifyConsumerIdsChangedEnable", "notify_consumer_ids_changed_enable", type=click.BOOL,
              help="Tell members to rebalance when the group changes [default: true].")
async def update_sub_group(s: AdminSession, broker_addr: str | None, cluster: str | None, group: str,
                           **settings: Any) -> Result:
    """Create a subscription group, or replace its settings (flags left out take their defaults)."""
    _check_group(group)
    brokers = await _targets(s, cluster, broker_addr)
    config = {"groupName": group, **{_WIRE[k]: v for k, v in settings.items() if v is not None}}
    body = orjson.dumps(config)
    res = settle(await s.gather_per_broker(
        brokers, lambda b: s.invoke(b.addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body)),
        "updateSubGroup")
    written = await _read_back(s, [b for b, _ in res.ok], group)
    rows = [(b.name, b.addr, "OK") for b, _ in res.ok] + [(b.name, b.addr, f"FAILED: {e}") for b, e in res.failed]
    data = {"groupName": group, "config": next(iter(written.values()), config), "brokers":
            [{"brokerName": b.name, "addr": b.addr, "config": written.get(b.addr)} for b, _ in res.ok],
            "failed": res.warnings}
    shown = data["config"]
    notes = [f"subscription group {group}: " + ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                                                         for k, v in shown.items() if k != "groupName")]
    return Result(data, [table(None, ["Broker", "Address", "Result"], rows)], notes, res.warnings,
                  ExitStatus.PARTIAL if res.warnings else ExitStatus.SUCCESS)


async def _read_back(s: AdminSession, brokers: list[BrokerRef], group: str) -> dict[str, dict]:
    """Each broker's stored config of ``group`` (GET_ALL_SUBSCRIPTIONGROUP_CONFIG), as the broker completed it."""
    out: dict[str, dict] = {}
    for b, resp in await s.gather_per_broker(
            brokers, lambda b: s.invoke(b.addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)):
        if not isinstance(resp, Exception):
            cfg = orjson.loads(resp.body or b"{}").get("subscriptionGroupTable", {}).get(group)
            if cfg is not None:
                out[b.addr] = cfg
    return out


@admin_command("deleteSubGroup", aliases=["delete-sub-group"])
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="Delete on this broker only.")
@click.option("-c", "--clusterName", "cluster", help="Delete on every master of this cluster.")
@click.option("-g", "--groupName", "group", required=True, help="The consumer group.")
@click.option("-r", "--removeOffset", "remove_offset", type=click.BOOL, default=False, show_default=True,
              help="Also drop the group's committed offsets.")
async def delete_sub_group(s: AdminSession, broker_addr: str | None, cluster: str | None, group: str,
                           remove_offset: bool) -> Result:
    """Delete a subscription group (with auto-creation on, its next heartbeat creates it again)."""
    brokers = await _targets(s, cluster, broker_addr)
    header = H.DeleteSubscriptionGroupRequestHeader(group_name=group, remove_offset=remove_offset)
    res = settle(await s.gather_per_broker(
        brokers, lambda b: s.invoke(b.addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, header)), "deleteSubGroup")
    rows = [(b.name, b.addr, "deleted") for b, _ in res.ok] + [(b.name, b.addr, f"FAILED: {e}")
                                                               for b, e in res.failed]
    return Result({"groupName": group, "removeOffset": remove_offset, "brokers": [b.name for b, _ in res.ok],
                   "failed": res.warnings}, [table(None, ["Broker", "Address", "Result"], rows)],
                  [f"subscription group {group} deleted" + (" with its offsets" if remove_offset else "")],
                  res.warnings, ExitStatus.PARTIAL if res.warnings else ExitStatus.SUCCESS)
