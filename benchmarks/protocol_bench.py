"""Remoting protocol throughput: frame codec, header parsing, and request/response over loopback.

Run: .venv/bin/python benchmarks/protocol_bench.py [--quick]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from sluice.protocol.client import RemotingClient
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.connection import RemotingConnection
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame
from sluice.protocol.headers import SendMessageRequestHeader
from sluice.protocol.server import RemotingServer


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


async def bench_loopback(n: int, concurrency: int, big: int) -> dict[str, float]:
    server = RemotingServer("127.0.0.1", 0)

    async def echo(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=req.body)
    server.register(1, echo)
    await server.start()
    client = RemotingClient()
    try:
        small = RemotingCommand.request(1, {"topic": "T", "queueId": 1}, b"y" * 100)
        await client.invoke(server.address, small)

        async def worker(count: int) -> None:
            for _ in range(count):
                await client.invoke(server.address, small, 10)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
        t_small = time.perf_counter() - t0
        body = b"z" * (1 << 20)
        large = RemotingCommand.request(1, body=body)
        t0 = time.perf_counter()
        for _ in range(big):
            await client.invoke(server.address, large, 30)
        t_big = time.perf_counter() - t0
    finally:
        await client.close()
        await server.close()
    return {"loopback_requests_per_s": (n // concurrency * concurrency) / t_small,
            "loopback_1mib_roundtrip_mb_per_s": 2 * big * len(body) / t_big / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small counts; finishes in a few seconds")
    args = ap.parse_args()
    n, rpc, big = (20_000, 4_000, 20) if args.quick else (200_000, 40_000, 200)
    result: dict[str, float | int | str] = {"benchmark": "protocol", "quick": args.quick, "frames": n, "requests": rpc}
    result.update(bench_codec(n))
    result.update(asyncio.run(bench_loopback(rpc, 32, big)))
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
