"""Broker CPU per transactional message: half send + END_TRANSACTION commit, against plain sends of the same
messages, on a real `sluice broker` subprocess over loopback (1 KiB bodies, raw remoting, pipelined). The
broker checks every second, so the half-queue reads the check makes are part of the transactional figure.

    .venv/bin/python benchmarks/transactions.py [--quick] [--rounds N]

Cases alternate (plain, transactional, plain, ...) on one broker, ``--rounds`` each; reported are the
median broker CPU microseconds per message of each and their ratio. The transactional case also pays the
op record and the real message's append: about three appends per message against one. The last line is
one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from produce_pull import BODY, cpu_seconds, start_server, stop_server

from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.msgid import decode_offset_msg_id, new_unique_id
from sluice.transport.client import RemotingClient

TOPIC = "BenchTx"
GROUP = "PG_bench_tx"
WINDOW = 64  # requests in flight


def _send(tx: bool, queue_id: int) -> RemotingCommand:
    props = {P.TAGS: "TagA", P.UNIQ_KEY: new_unique_id()}
    if tx:
        props.update({P.TRAN_MSG: "true", P.PGROUP: GROUP})
    h = H.SendMessageRequestHeader(producer_group=GROUP, topic=TOPIC, queue_id=queue_id,
                                   properties=P.encode_properties(props), born_timestamp=int(time.time() * 1000),
                                   sys_flag=0x4 if tx else 0, default_topic_queue_nums=4)
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), BODY)


async def _one(client: RemotingClient, addr: str, tx: bool, i: int) -> None:
    resp = await client.invoke(addr, _send(tx, i % 4), 30)
    if resp.code != 0:
        raise RuntimeError(f"send failed: {resp.code} {resp.remark}")
    if tx:
        f = resp.ext_fields
        end = H.EndTransactionRequestHeader(producer_group=GROUP, tran_state_table_offset=int(f["queueOffset"]),
                                            commit_log_offset=decode_offset_msg_id(f["msgId"]).offset,
                                            commit_or_rollback=8, msg_id="m")
        await client.invoke_oneway(addr, RemotingCommand.request(RequestCode.END_TRANSACTION, end.to_ext(),
                                                                 oneway=True))


async def _case(client: RemotingClient, addr: str, pid: int, tx: bool, n: int) -> float:
    sem = asyncio.Semaphore(WINDOW)

    async def guarded(i: int) -> None:
        async with sem:
            await _one(client, addr, tx, i)
    b0 = cpu_seconds(pid)
    await asyncio.gather(*(guarded(i) for i in range(n)))
    await asyncio.sleep(0.5)  # the oneway commits are handled
    return (cpu_seconds(pid) - b0) / n * 1e6


async def main_async(n: int, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "broker.toml"  # checks (and their half-queue reads) every second count in the cost
        conf.write_text("transaction_check_interval_ms = 1000\n")
        proc, addr = start_server(["broker", "--store", str(Path(tmp) / "store"), "--config", str(conf)],
                                  Path(tmp) / "broker.log")
        client = RemotingClient()
        try:
            await _case(client, addr, proc.pid, False, 500)  # warm-up, creates the topic
            await _case(client, addr, proc.pid, True, 500)
            plain, tx = [], []
            for _ in range(rounds):
                plain.append(await _case(client, addr, proc.pid, False, n))
                tx.append(await _case(client, addr, proc.pid, True, n))
        finally:
            await client.close()
            stop_server(proc)
    p, t = statistics.median(plain), statistics.median(tx)
    return {"messages_per_case": n, "rounds": rounds, "plain_broker_cpu_us_per_msg": round(p, 2),
            "transactional_broker_cpu_us_per_msg": round(t, 2), "transactional_over_plain": round(t / p, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    res = asyncio.run(main_async(2000 if a.quick else 20000, 1 if a.quick else a.rounds))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
