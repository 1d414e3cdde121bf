"""The floor under every latency row: one loopback TCP hop into a sleeping asyncio loop, on this machine.

The latency row's message makes two such hops (producer -> broker, broker -> consumer) whatever the system,
each a write that wakes a process parked in epoll on a loop that then runs a protocol callback. This measures
one: a sender process (this script with ``--send``) writes an 8-byte ``perf_counter_ns`` stamp every
1/``--rate`` s (TCP_NODELAY) and this process's asyncio loop reads it; the figure is read time minus stamp
(both processes read the same CLOCK_MONOTONIC). No broker, no codec: what is left of a latency figure after
two of these is what the system's own code costs.

Run: .venv/bin/python benchmarks/loopback_floor.py [--quick] [--rate 1000] [--seconds S]
Prints one JSON object on its last line: the one-way p50 / p90 / p99 in microseconds and ``two_hops_p50_us``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time


def send(port: int, rate: int, count: int) -> None:
    """The sender: ``count`` stamps paced at ``rate`` per second, then close."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        gap, due = 1.0 / rate, time.perf_counter()
        for _ in range(count):
            due += gap
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            c.sendall(time.perf_counter_ns().to_bytes(8, "little"))


class _Stamps(asyncio.Protocol):
    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.lat_ns: list[int] = []
        self._rest = b""

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        data, cut = self._rest + data, len(self._rest + data) // 8 * 8
        self._rest = data[cut:]
        self.lat_ns.extend(now - int.from_bytes(data[i:i + 8], "little") for i in range(0, cut, 8))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def receive(rate: int, count: int, timeout: float) -> list[int]:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    proto = _Stamps(done)
    server = await loop.create_server(lambda: proto, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sender = subprocess.Popen([sys.executable, __file__, "--send", str(port), "--rate", str(rate),
                               "--count", str(count)], stdin=subprocess.DEVNULL)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        server.close()
        try:
            sender.wait(5)
        except subprocess.TimeoutExpired:
            sender.kill()
            sender.wait()
    if sender.returncode:
        raise SystemExit(f"the sender exited with {sender.returncode}")
    return proto.lat_ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 s instead of 5 s")
    ap.add_argument("--rate", type=int, default=1000, help="stamps per second (the latency row's 1,000)")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--send", type=int, default=0, help=argparse.SUPPRESS)  # the sender's role: the port
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rate < 1:
        ap.error("--rate must be positive")
    if args.send:
        send(args.send, args.rate, args.count)
        return
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 5.0)
    count = max(100, int(args.rate * seconds))
    lat = asyncio.run(receive(args.rate, count, seconds * 3 + 30))
    if len(lat) != count:
        raise SystemExit(f"received {len(lat)} of {count} stamps")
    warm = sorted(lat[len(lat) // 5:])  # the first fifth: connection and caches warming

    def q(p: float) -> float:
        return round(warm[min(len(warm) - 1, int(len(warm) * p))] / 1000, 1)
    out = {"quick": args.quick, "rate": args.rate, "stamps": len(warm), "one_way_p50_us": q(0.5),
           "one_way_p90_us": q(0.9), "one_way_p99_us": q(0.99), "two_hops_p50_us": round(2 * q(0.5), 1)}
    print(f"one loopback hop into an asyncio loop at {args.rate:,}/s: p50 {out['one_way_p50_us']} us, "
          f"p90 {out['one_way_p90_us']}, p99 {out['one_way_p99_us']}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
