"""The broker's own path from a send's read to the write of its reply and of the held pull it wakes (issue 15's
latency row), without sockets, scheduling or a client: what the broker adds between them.

An in-process BrokerController; one connection carries a producer and a push-style consumer (as the SDK's one
client connection does), through an in-memory transport. A pull on ``region = 'eu'`` is held at the queue's end;
single 1 KiB sends follow, every tenth with ``region = 'eu'`` (it wakes the pull, which is pulled again at its
next offset), the rest ``us``. Per send, perf_counter from ``data_received`` to the transport's first write
(``to_write``: what a waiting client waits for) and to ``data_received``'s return (``read_total``: the loop is
busy until then), medians over the sends after the first fifth, for matched and unmatched sends, and the
process CPU per send (the harness's own work included). ``--pace-ms 1`` sleeps that long between sends, as at
1,000 msgs/s, so the broker's code runs cold as it does there.

``--segments`` also times the broker's steps inside each send (its methods wrapped with timers, which add
well under a microsecond each): the send handler, the append, the dispatch step, answering the woken pulls
(``HoldService.end_fires``) and the key index, medians per matched and unmatched send.

Run: .venv/bin/python benchmarks/send_wake_path.py [--quick] [--sends N] [--pace-ms MS] [--segments]
Prints one JSON object on its last line.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import orjson  # noqa: E402

from sluice.broker.config import BrokerConfig  # noqa: E402
from sluice.broker.controller import BrokerController  # noqa: E402
from sluice.protocol import headers as H  # noqa: E402
from sluice.protocol import properties as P  # noqa: E402
from sluice.protocol.codes import RequestCode  # noqa: E402
from sluice.protocol.command import RemotingCommand  # noqa: E402
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame_head  # noqa: E402

TOPIC = "SendWake"
BODY = b"x" * 1024


def _wire(cmd: RemotingCommand, opaque: int) -> bytes:
    return encode_frame_head(cmd, opaque, cmd.flag, cmd.serialize_type) + (cmd.body or b"")


def _send(i: int, region: str) -> RemotingCommand:
    props = {"region": region, "a": str(i % 100), P.TAGS: "TagA", P.UNIQ_KEY: "%032X" % i}
    h = H.SendMessageRequestHeader(producer_group="PG", topic=TOPIC, queue_id=0, born_timestamp=1,
                                   properties=P.encode_properties(props))
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), BODY)


def _pull(offset: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(
        consumerGroup="G", topic=TOPIC, queueId=0, queueOffset=offset, maxMsgNums=32, sysFlag=0x2 | 0x4,
        commitOffset=0, suspendTimeoutMillis=60_000, subVersion=1, subscription="region = 'eu'",
        expressionType="SQL92"))


#: The broker steps ``--segments`` times: (class path, method, name).
SEGMENTS = [("sluice.broker.send:SendProcessor", "handle", "send_handler"),
            ("sluice.broker.appender:Appender", "_append", "append"),
            ("sluice.store.dispatch:DispatchService", "_dispatch", "dispatch"),
            ("sluice.broker.longpoll:HoldService", "end_fires", "woken_answers"),
            ("sluice.broker.appender:Appender", "index_deferred", "key_index")]


class _Segments:
    """Wraps the SEGMENTS methods with timers; ``spent`` holds each one's microseconds since :meth:`take`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        for where, method, name in SEGMENTS:
            module, cls_name = where.split(":")
            cls = getattr(importlib.import_module(module), cls_name)
            setattr(cls, method, self._timed(getattr(cls, method), name))

    def _timed(self, f: Any, name: str) -> Any:
        spent = self.spent

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + (time.perf_counter() - t0) * 1e6
        return timed

    def take(self) -> dict[str, float]:
        out = dict(self.spent)
        self.spent.clear()
        return out


class _Transport(asyncio.Transport):
    """Keeps the bytes written and the time of the first write since :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list[bytes] = []
        self.first: float | None = None

    def write(self, data: Any) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        self.data.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def take(self) -> list[RemotingCommand]:
        codec = FrameCodec()
        codec.receive_data(b"".join(self.data))
        self.data.clear()
        self.first = None
        out = []
        while (frame := codec.next_frame()) is not NEED_DATA:
            out.append(frame)
        return out


async def connected_group(broker: BrokerController) -> tuple[Any, _Transport]:
    """One connection to ``broker`` through the in-memory transport, the topic made by a first send, and group
    G on ``region = 'eu'`` (SQL92) registered by a heartbeat (pull_few_path.py starts the same way)."""
    conn, t = broker.server._new_connection(), _Transport()
    conn.connection_made(t)
    conn.data_received(_wire(_send(0, "none"), 1))  # creates the topic
    while not t.data:
        await asyncio.sleep(0.005)
    t.take()
    hb = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": "G", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [{
            "topic": TOPIC, "subString": "region = 'eu'", "expressionType": "SQL92", "subVersion": 1,
            "tagsSet": [], "codeSet": []}]}]}
    conn.data_received(_wire(RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(hb)), 2))
    return conn, t


async def _run(root: str, sends: int, pace_s: float, segments: _Segments | None) -> dict[str, float]:
    broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:0", store=root + "/store"))
    await broker.start()
    try:
        conn, t = await connected_group(broker)
        opaque = 10
        conn.data_received(_wire(_pull(1), opaque))
        pull_opaque = opaque
        opaque += 1
        await asyncio.sleep(0.05)
        t.take()
        times: dict[str, list[float]] = {"matched_to_write": [], "unmatched_to_write": [],
                                         "matched_read_total": [], "unmatched_read_total": []}
        steps: dict[str, list[float]] = {}
        c0 = time.process_time()
        for i in range(1, sends + 1):
            matched = i % 10 == 0
            data = _wire(_send(i, "eu" if matched else "us"), opaque)
            opaque += 1
            t0 = time.perf_counter()
            conn.data_received(data)
            t1 = time.perf_counter()
            kind = "matched" if matched else "unmatched"
            if t.first is None:
                raise RuntimeError(f"send {i}: nothing written within its read")
            times[kind + "_to_write"].append((t.first - t0) * 1e6)
            times[kind + "_read_total"].append((t1 - t0) * 1e6)
            if segments is not None:
                for name, us in segments.take().items():
                    steps.setdefault(f"{kind}_{name}", []).append(us)
            frames = [f for f in t.take() if f.is_response]
            if matched:
                answers = [f for f in frames if f.opaque == pull_opaque]
                if not answers:
                    raise RuntimeError(f"send {i} matched but woke no pull answer")
                pull_opaque = opaque
                conn.data_received(_wire(_pull(int(answers[0].ext_fields["nextBeginOffset"])), opaque))
                opaque += 1
                t.take()
                if segments is not None:
                    segments.take()  # the next pull's handling is not the send's
            await asyncio.sleep(pace_s)  # let the loop run what it scheduled, as between real reads
        cpu = (time.process_time() - c0) / sends * 1e6
    finally:
        await broker.stop()
    out = {f"{k}_us": round(statistics.median(v[len(v) // 5:]), 1) for k, v in times.items()}
    out["cpu_us_per_send"] = round(cpu, 1)
    if segments is not None:
        out["segments_us"] = {k: round(statistics.median(v[len(v) // 5:]), 1) for k, v in sorted(steps.items())}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 sends instead of 5,000")
    ap.add_argument("--sends", type=int, default=0)
    ap.add_argument("--pace-ms", type=float, default=0.0, help="sleep between sends (1: as at 1,000 msgs/s)")
    ap.add_argument("--segments", action="store_true", help="also time the broker's steps inside each send")
    args = ap.parse_args()
    sends = args.sends or (1000 if args.quick else 5000)
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="sluice-sendwake-") as root:
        result = asyncio.run(_run(root, sends, max(0.0, args.pace_ms) / 1000.0,
                                  _Segments() if args.segments else None))
    print(json.dumps({"quick": args.quick, "sends": sends, "pace_ms": args.pace_ms, **result}))


if __name__ == "__main__":
    main()
