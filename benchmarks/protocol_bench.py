"""Remoting protocol throughput and CPU cost: frame codec, header parsing, and request/response over loopback.

The loopback cases run the RemotingServer in a subprocess (this script with
``--serve``) so the server's and the client's CPU are measured apart: CPU
microseconds per request for each process (``time.process_time()`` deltas; the
server reports its own through a stats request), which on a shared machine is
steadier than requests/s.

Cases: ``rpc1`` one request in flight; ``pipelined128`` 128 small requests in
flight on one connection (a GET_MAX_OFFSET-sized exchange) to an ``async def``
handler, ``pipelined128_sync`` the same to a plain-function handler (skipped
when the transport does not support those); ``body1mib`` 1 MiB echoed back.

Run: .venv/bin/python benchmarks/protocol_bench.py [--quick]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from sluice.transport.client import RemotingClient
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.transport.server import RemotingServer

ECHO_ASYNC, ECHO_SYNC, STATS = 1, 2, 3


def bench_codec(n: int) -> dict[str, float]:
    header = SendMessageRequestHeader(producer_group="PG", topic="Orders", queue_id=3, born_timestamp=1700000000000,
                                      properties="TAGS\x01TagA\x02KEYS\x01k1\x02UNIQ_KEY\x01AC1100010000\x02")
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), b"x" * 1024)
    t0 = time.perf_counter()
    frames = [encode_frame(cmd.with_opaque(i)) for i in range(n)]
    t_enc = time.perf_counter() - t0
    stream = b"".join(frames)
    codec = FrameCodec()
    got = 0
    t0 = time.perf_counter()
    for i in range(0, len(stream), 65536):
        codec.receive_data(stream[i:i + 65536])
        while (frame := codec.next_frame()) is not NEED_DATA:
            got += 1
    t_dec = time.perf_counter() - t0
    assert got == n
    t0 = time.perf_counter()
    for _ in range(n):
        SendMessageRequestHeader.from_command(cmd)
    t_hdr = time.perf_counter() - t0
    return {"encode_frames_per_s": n / t_enc, "decode_frames_per_s": n / t_dec,
            "decode_mb_per_s": len(stream) / t_dec / 1e6, "send_header_parse_per_s": n / t_hdr}


# ------------------------------------------------------------------------------------------ server side

async def serve() -> None:
    server = RemotingServer("127.0.0.1", 0)

    async def echo_async(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields={"offset": 1234}, body=req.body)

    def echo_sync(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields={"offset": 1234}, body=req.body)

    async def stats(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields={"cpu": repr(time.process_time())})
    server.register(ECHO_ASYNC, echo_async)
    server.register(ECHO_SYNC, echo_sync)  # type: ignore[arg-type]  # older transports refuse it (SYSTEM_ERROR)
    server.register(STATS, stats)
    await server.start()
    print(server.port, flush=True)
    # Serve until the parent closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.close()


# ------------------------------------------------------------------------------------------ client side

async def server_cpu(client: RemotingClient, addr: str) -> float:
    return float((await client.invoke(addr, RemotingCommand.request(STATS), 10)).ext_fields["cpu"])


async def measure(client: RemotingClient, addr: str, req: RemotingCommand, n: int, inflight: int) -> dict[str, float]:
    per_worker = n // inflight

    async def worker() -> None:
        for _ in range(per_worker):
            await client.invoke(addr, req, 30)
    s0, c0, t0 = await server_cpu(client, addr), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed, c1, s1 = time.perf_counter() - t0, time.process_time(), await server_cpu(client, addr)
    done = per_worker * inflight
    return {"requests_per_s": round(done / elapsed, 1),
            "server_cpu_us_per_req": round((s1 - s0) / done * 1e6, 2),
            "client_cpu_us_per_req": round((c1 - c0) / done * 1e6, 2)}


async def bench_loopback(addr: str, quick: bool) -> dict[str, dict[str, float]]:
    client = RemotingClient()
    out: dict[str, dict[str, float]] = {}
    try:
        small = RemotingCommand.request(ECHO_ASYNC, {"topic": "Orders", "queueId": 1})
        small_sync = RemotingCommand.request(ECHO_SYNC, {"topic": "Orders", "queueId": 1})
        await client.invoke(addr, small)
        n = 20_000 if quick else 200_000
        out["rpc1"] = await measure(client, addr, small, n // 10, 1)
        out["pipelined128"] = await measure(client, addr, small, n, 128)
        if (await client.invoke(addr, small_sync, 10)).code == 0:
            out["pipelined128_sync"] = await measure(client, addr, small_sync, n, 128)
        big = RemotingCommand.request(ECHO_ASYNC, body=b"z" * (1 << 20))
        nbig = 20 if quick else 200
        stats = await measure(client, addr, big, nbig, 1)
        stats["mb_per_s"] = round(2 * stats["requests_per_s"] * len(big.body) / 1e6, 1)
        out["body1mib"] = stats
    finally:
        await client.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small counts; finishes in a few seconds")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve())
        return
    n = 20_000 if args.quick else 200_000
    result: dict[str, object] = {"benchmark": "protocol", "quick": args.quick, "frames": n}
    result.update({k: round(v, 1) for k, v in bench_codec(n).items()})
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        result.update(asyncio.run(bench_loopback(f"127.0.0.1:{port}", args.quick)))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
