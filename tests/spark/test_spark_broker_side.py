"""The broker side of the Spark pipeline end to end: a replayed write is stored once (broker dedup), and a
`backfill` computed by Spark over the running broker's store is handed over so pulls read only bit-1 records."""
from __future__ import annotations

import io
import time

import orjson
import pytest
from servers import running_cluster, wait_for_route

from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import iter_records
from sluice.transport.blocking import SyncRemotingClient

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

N = 200
EXPR = "k = 'hit'"


def _records_read(client: SyncRemotingClient, addr: str) -> int:
    resp = client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5.0)
    return int(orjson.loads(resp.body)["table"]["pull_records_read"])


def _pull_queue(client: SyncRemotingClient, addr: str, topic: str, qid: int, group: str) -> list[int]:
    got, offset = [], 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = client.invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(
            consumerGroup=group, topic=topic, queueId=qid, queueOffset=offset, maxMsgNums=32, sysFlag=0x4,
            commitOffset=0, suspendTimeoutMillis=0, subVersion=0, subscription=EXPR, expressionType="SQL92")), 5.0)
        if r.code == 0:
            got += [int(P.decode_properties(m.properties)["i"]) for m in iter_records(r.body)]
        elif r.code != 20:
            break
        nxt = int(r.ext_fields["nextBeginOffset"])
        if nxt >= int(r.ext_fields["maxOffset"]) or nxt == offset:
            break
        offset = nxt
    return got


def test_replayed_write_stored_once_then_backfill_handed_over(spark, tmp_path):
    from sluice.admin import main as admin_main
    from sluice.spark.backfill import backfill

    with running_cluster(tmp_path, config="enable_property_filter = true\n") as c:
        ns, br, store = c.namesrv, c.broker, c.store()
        rows = [(f"r{i}".encode(), {"k": "hit" if i % 5 == 0 else "miss", "i": str(i)}) for i in range(N)]
        df = spark.createDataFrame(rows, "body binary, properties map<string,string>")
        for _ in range(2):  # the second write replays every (write id, partition, row) of the first
            df.write.format("sluice").option("namesrv", ns.addr).option("topic", "Replayed") \
                .option("writeId", "fixed-write").mode("append").save()
        queues = max(q.read_queue_nums for q in wait_for_route(ns.addr, "Replayed", timeout=20.0).queue_datas)
        back = spark.read.format("sluice").option("namesrv", ns.addr).option("topic", "Replayed").load() \
            .select("msg_id", "properties").collect()
        assert len(back) == N and len({r.msg_id for r in back}) == N
        assert all(r.properties["SLUICE_DEDUP"] == "1" for r in back)

        m = backfill(spark, str(store), "Replayed", "g-new", EXPR, str(tmp_path / "bf"))
        hits = sorted(i for i in range(N) if i % 5 == 0)
        assert sum(q["matched"] for q in m["queues"].values()) == len(hits)
        out = io.StringIO()
        status = admin_main(["-n", ns.addr, "--json", "loadBackfill", "-d", str(tmp_path / "bf"), "-b", br.addr],
                            env={}, stdout=out, stderr=io.StringIO())
        assert int(status) == 0, out.getvalue()
        client = SyncRemotingClient()
        try:
            before = _records_read(client, br.addr)
            got = sorted(i for q in range(queues) for i in _pull_queue(client, br.addr, "Replayed", q, "g-new"))
            assert got == hits
            assert _records_read(client, br.addr) - before == len(hits)  # bit-0 records never read
        finally:
            client.close()
