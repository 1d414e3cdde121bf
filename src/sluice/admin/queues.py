"""Topic and queue commands: updateTopicPerm, topicClusterList, allocateMQ, queryMsgByOffset, printMsg,
printMsgByQueue, cloneGroupOffset, skipAccumulatedMessage (mqadmin's, with its flags;
tools/src/main/java/org/apache/rocketmq/tools/command/{topic,message,offset}/)."""
from __future__ import annotations

from collections import Counter
from typing import Any

import click

from sluice.admin import consumers as consumer_commands
from sluice.admin.core import admin_command
from sluice.admin.messages import _read_queue
from sluice.admin.output import Result, body_preview, fmt_time, message_detail, message_json, table
from sluice.admin.params import TIMESTAMP
from sluice.admin.session import TOOLS_CONSUMER_GROUP, AdminSession, BrokerRef, settle
from sluice.admin.status import ExitStatus
from sluice.admin.topics import perm_text
from sluice.client.allocate import STRATEGIES
from sluice.client.results import MessageQueue, PullStatus
from sluice.client.routing import subscribe_queues
from sluice.client.selector import MessageSelector
from sluice.errors import NotFoundError, TopicNotExistError
from sluice.message import MessageExt
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode

#: printMsg / printMsgByQueue read at most this many messages unless told otherwise (mqadmin has no bound).
DEFAULT_PRINT_MAX = 10_000


# ------------------------------------------------------------------------------------------ topics

@admin_command("updateTopicPerm", aliases=["update-topic-perm"])
@click.option("-t", "--topic", required=True)
@click.option("-p", "--perm", type=click.Choice(["2", "4", "6"]), required=True,
              help="2 write only, 4 read only, 6 read and write.")
@click.option("-b", "--brokerAddr", "broker_addr", metavar="HOST:PORT", help="On this broker only.")
@click.option("-c", "--clusterName", "cluster", help="On every broker of this cluster that has the topic.")
async def update_topic_perm(s: AdminSession, topic: str, perm: str, broker_addr: str | None,
                            cluster: str | None) -> Result:
    """Change a topic's permission, keeping its queues (UPDATE_AND_CREATE_TOPIC with the route's queue counts)."""
    if (cluster is None) == (broker_addr is None):
        raise click.UsageError("give exactly one of -c/--clusterName and -b/--brokerAddr")
    route = await s.route(topic)
    queue_of = {q.broker_name: q for q in route.queue_datas}
    targets: list[tuple[BrokerRef, Any]] = []
    for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
        addr = bd.broker_addrs.get(0)
        if not addr or bd.broker_name not in queue_of:
            continue
        if (broker_addr is not None and addr == broker_addr) or (cluster is not None and bd.cluster == cluster):
            targets.append((BrokerRef(bd.cluster, bd.broker_name, 0, addr), queue_of[bd.broker_name]))
    if not targets:
        where = f"broker {broker_addr}" if broker_addr else f"cluster {cluster!r}"
        raise TopicNotExistError(f"topic {topic!r} is not on {where}")
    new = int(perm)
    by_addr = {b.addr: q for b, q in targets}

    async def one(b: BrokerRef) -> int:
        q = by_addr[b.addr]
        await s.invoke(b.addr, RequestCode.UPDATE_AND_CREATE_TOPIC, H.CreateTopicRequestHeader(
            topic=topic, read_queue_nums=q.read_queue_nums, write_queue_nums=q.write_queue_nums, perm=new,
            topic_sys_flag=q.topic_syn_flag))
        return q.perm
    res = settle(await s.gather_per_broker([b for b, _ in targets], one), "updateTopicPerm")
    rows = [(b.name, b.addr, perm_text(old), perm_text(new)) for b, old in res.ok]
    rows += [(b.name, b.addr, perm_text(by_addr[b.addr].perm), f"FAILED: {e}") for b, e in res.failed]
    data = {"topic": topic, "perm": new, "brokers": [{"brokerName": b.name, "addr": b.addr, "oldPerm": old}
                                                     for b, old in res.ok], "failed": res.warnings}
    return Result(data, [table(None, ["Broker", "Address", "Old Perm", "New Perm"], rows)],
                  [f"topic {topic}: perm {perm_text(new)}"], res.warnings,
                  ExitStatus.PARTIAL if res.failed else ExitStatus.SUCCESS)


@admin_command("topicClusterList", aliases=["topic-cluster-list"])
@click.option("-t", "--topic", required=True)
async def topic_cluster_list(s: AdminSession, topic: str) -> Result:
    """The clusters whose brokers serve a topic."""
    route = await s.route(topic)
    clusters = sorted({bd.cluster for bd in route.broker_datas})
    return Result({"topic": topic, "clusters": clusters}, [table(None, ["Cluster"], [(c,) for c in clusters])])


@admin_command("allocateMQ", aliases=["allocate-mq"])
@click.option("-t", "--topic", required=True)
@click.option("-i", "--ipList", "ip_list", required=True, help="Client ids (IPs), comma-separated.")
@click.option("--strategy", type=click.Choice(sorted(STRATEGIES)), default="AVG", show_default=True,
              help="The allocation strategy (mqadmin: AVG).")
async def allocate_mq(s: AdminSession, topic: str, ip_list: str, strategy: str) -> Result:
    """Which queues each client of a group would get (AllocateMessageQueueAveragely by default)."""
    ips = [ip.strip() for ip in ip_list.split(",") if ip.strip()]
    if not ips:
        raise click.UsageError("-i/--ipList is empty")
    queues = subscribe_queues(topic, await s.route(topic))
    allocate = STRATEGIES[strategy]
    result = {ip: [{"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id}
                   for q in allocate(ip, queues, ips)] for ip in ips}
    rows = [(ip, q["brokerName"], q["queueId"]) for ip, qs in result.items() for q in qs]
    return Result({"result": result}, [table(None, ["Client", "Broker", "QID"], rows, right=["QID"])])


# ------------------------------------------------------------------------------------------ messages

async def _queue(s: AdminSession, topic: str, broker_name: str, queue_id: int) -> MessageQueue:
    for q in await s.read_queues(topic):
        if q.broker_name == broker_name and q.queue_id == queue_id:
            return q
    raise NotFoundError(f"topic {topic!r} has no readable queue {queue_id} on broker {broker_name!r}")


@admin_command("queryMsgByOffset", aliases=["query-msg-by-offset"])
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=click.IntRange(min=0), required=True)
@click.option("-o", "--offset", type=click.IntRange(min=0), required=True, help="The queue offset.")
@click.option("-f", "--bodyFormat", "body_format", type=click.Choice(["UTF-8"], case_sensitive=False),
              help="Accepted for mqadmin compatibility: bodies show as UTF-8 (JSON: base64 when not text).")
async def query_msg_by_offset(s: AdminSession, topic: str, broker_name: str, queue_id: int, offset: int,
                              body_format: str | None) -> Result:
    """The message at one queue offset."""
    mq = await _queue(s, topic, broker_name, queue_id)
    r = await s.pull(mq, MessageSelector.by_tag(None), offset, 1)
    msgs = [m for m in r.msg_found_list if m.queue_offset == offset]
    if r.status is not PullStatus.FOUND or not msgs:
        raise NotFoundError(f"no message at offset {offset} of queue {queue_id} of {topic!r} on {broker_name} "
                            f"({r.status.value}, the queue holds {r.min_offset}..{r.max_offset - 1})")
    return Result(message_json(msgs[0]), [message_detail(msgs[0])])


async def _read(s: AdminSession, mq: MessageQueue, sub: str | None, begin: int | None, end: int | None,
                limit: int) -> list[MessageExt]:
    return await _read_queue(s, mq, MessageSelector.by_tag(sub), TOOLS_CONSUMER_GROUP, None, begin, end, limit)


def _print_rows(msgs: list[MessageExt], body: bool) -> list[tuple[Any, ...]]:
    return [(m.queue_id, m.queue_offset, m.msg_id, m.tags or "", " ".join(m.keys), fmt_time(m.store_timestamp))
            + ((body_preview(m.body, 200),) if body else ()) for m in msgs]


def _print_result(topic: str, msgs: list[MessageExt], body: bool, limit: int) -> Result:
    cols = ["QID", "Offset", "Msg ID", "Tags", "Keys", "Stored"] + (["Body"] if body else [])
    warnings = [f"stopped at {limit} messages (--maxNum)"] if len(msgs) >= limit else []
    return Result({"topic": topic, "messages": [message_json(m) for m in msgs]},
                  [table(None, cols, _print_rows(msgs, body), right=["QID", "Offset"])],
                  [f"{len(msgs)} message(s)"], warnings)


@admin_command("printMsg", aliases=["print-msg"])
@click.option("-t", "--topic", required=True)
@click.option("-c", "--charsetName", "charset", default="UTF-8", show_default=True,
              help="Bodies are shown as UTF-8 (accepted for mqadmin compatibility).")
@click.option("-s", "--subExpression", "sub", help="Tag expression, e.g. 'TagA || TagB' [default: *].")
@click.option("-b", "--beginTimestamp", "begin", type=TIMESTAMP, help="From the first message stored then.")
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP, help="Up to messages stored then.")
@click.option("-d", "--printBody", "print_body", type=click.BOOL, default=True, show_default=True)
@click.option("-m", "--maxNum", "limit", type=click.IntRange(min=1), default=DEFAULT_PRINT_MAX, show_default=True,
              help="Stop after this many messages (Sluice's bound).")
async def print_msg(s: AdminSession, topic: str, charset: str, sub: str | None, begin: int | None, end: int | None,
                    print_body: bool, limit: int) -> Result:
    """Every message of a topic (in a time range), queue by queue, without committing anything."""
    out: list[MessageExt] = []
    for mq in await s.read_queues(topic):
        if len(out) >= limit:
            break
        out += await _read(s, mq, sub, begin, end, limit - len(out))
    return _print_result(topic, out, print_body, limit)


@admin_command("printMsgByQueue", aliases=["print-msg-by-queue"])
@click.option("-t", "--topic", required=True)
@click.option("-a", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=click.IntRange(min=0), required=True)
@click.option("-c", "--charsetName", "charset", default="UTF-8", show_default=True,
              help="Bodies are shown as UTF-8 (accepted for mqadmin compatibility).")
@click.option("-s", "--subExpression", "sub", help="Tag expression [default: *].")
@click.option("-b", "--beginTimestamp", "begin", type=TIMESTAMP)
@click.option("-e", "--endTimestamp", "end", type=TIMESTAMP)
@click.option("-p", "--print", "print_msgs", type=click.BOOL, default=False, show_default=True,
              help="List the messages.")
@click.option("-d", "--printBody", "print_body", type=click.BOOL, default=False, show_default=True)
@click.option("-f", "--calculate", type=click.BOOL, default=False, show_default=True, help="Count messages by tag.")
@click.option("-m", "--maxNum", "limit", type=click.IntRange(min=1), default=DEFAULT_PRINT_MAX, show_default=True)
async def print_msg_by_queue(s: AdminSession, topic: str, broker_name: str, queue_id: int, charset: str,
                             sub: str | None, begin: int | None, end: int | None, print_msgs: bool, print_body: bool,
                             calculate: bool, limit: int) -> Result:
    """The messages of one queue: listed (-p true), or counted by tag (-f true)."""
    mq = await _queue(s, topic, broker_name, queue_id)
    msgs = await _read(s, mq, sub, begin, end, limit)
    result = _print_result(topic, msgs, print_body, limit)
    if not print_msgs:
        result.tables = []
    if calculate:
        counts = Counter(m.tags or "" for m in msgs)
        result.data["tags"] = dict(counts.most_common())
        result.tables.append(table("By tag", ["Tag", "Messages"], counts.most_common(), right=["Messages"]))
    return result


# ------------------------------------------------------------------------------------------ offsets

@admin_command("cloneGroupOffset", aliases=["clone-group-offset"])
@click.option("-s", "--srcGroup", "src", required=True)
@click.option("-d", "--destGroup", "dest", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-o", "--offline", type=click.BOOL, default=False, show_default=True,
              help="Accepted for mqadmin compatibility: offsets are written the same way either way.")
async def clone_group_offset(s: AdminSession, src: str, dest: str, topic: str, offline: bool) -> Result:
    """Give ``destGroup`` the committed offsets ``srcGroup`` has on a topic, queue by queue."""
    entries, _tps, warnings = await consumer_commands.consume_stats(s, src, topic)
    committed = [e for e in entries if int(e["consumerOffset"]) >= 0]
    if not committed:
        raise NotFoundError(f"group {src!r} has no committed offset on topic {topic!r}")
    route = await s.route(topic)
    addr_of = {bd.broker_name: a for bd in route.broker_datas if (a := bd.broker_addrs.get(0))}
    rows = []
    for e in committed:
        mq = MessageQueue(topic=topic, broker_name=e["brokerName"], queue_id=int(e["queueId"]))
        addr = addr_of.get(mq.broker_name)
        if addr is None:
            warnings.append(f"broker {mq.broker_name} has no master in the route; queue {mq.queue_id} skipped")
            continue
        await s.commit_offset(addr, dest, mq, int(e["consumerOffset"]))
        rows.append({"brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": int(e["consumerOffset"])})
    return Result({"srcGroup": src, "destGroup": dest, "topic": topic, "offsetTable": rows},
                  [table(None, ["Broker", "QID", "Offset"], [(r["brokerName"], r["queueId"], r["offset"])
                                                             for r in rows], right=["QID", "Offset"])],
                  [f"{len(rows)} queue offset(s) of {src} cloned to {dest}"], warnings,
                  ExitStatus.PARTIAL if warnings else ExitStatus.SUCCESS)


@admin_command("skipAccumulatedMessage", aliases=["skip-accumulated-message"])
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-f", "--force", type=click.BOOL, default=True, show_default=True)
@click.option("-c", "--cluster", help="Accepted for mqadmin compatibility (the topic's route names the brokers).")
async def skip_accumulated_message(s: AdminSession, group: str, topic: str, force: bool,
                                   cluster: str | None) -> Result:
    """Move the group's offsets to the end of every queue of the topic (resetOffsetByTime -s latest)."""
    reset = consumer_commands.reset_offset_by_time.callback.__wrapped__  # type: ignore[union-attr]
    return await reset(s, group=group, topic=topic, timestamp=-1, offset=None, queue_id=None, broker_name=None,
                       force=force, cplus=False)
