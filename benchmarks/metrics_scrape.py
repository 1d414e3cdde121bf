"""CPU cost of a /metrics scrape of a broker with many consumer groups, in process.

A scrape's lag side (broker/metrics_lag.py) runs consumerProgress's count for every group: consume
queues read, each queue's filtered lag evaluated with the group's SQL92 selector. With
``metrics_lag_refresh_s`` 0 that happens on every scrape (what every scrape did before the setting
existed); with the default it happens once per refresh period and scrapes in between are served
from the last count. Measured as CPU time (time.process_time: every thread of this process, the
broker's loop and store pool included) per HTTP scrape, over a burst of scrapes (a Prometheus
scraping every 15 s meets the count about once per scrape either way; several Prometheus servers,
a dashboard refreshing, or a short scrape_interval meet it once per period instead of once per
scrape), alternating rounds of the two settings on fresh brokers over the same store.

    .venv/bin/python benchmarks/metrics_scrape.py [--quick] [--groups N]

On a checkout without the setting the "every" figure alone is measured. The last line is one JSON
object: milliseconds of CPU per scrape with the count every scrape and with the default refresh, and
how many scrapes failed each way (a count slower than the 8 s scrape timeout answers HTTP 500).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from sluice.broker.config import BrokerConfig
from sluice.broker.controller import BrokerController
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import LoopThread, SyncRemotingClient

TOPIC = "ScrapeBench"
QUEUES = 4
HAS_REFRESH = "metrics_lag_refresh_s" in {f.name for f in dataclasses.fields(BrokerConfig)}


class Running:
    def __init__(self, store: Path, **settings: Any) -> None:
        self.loop = LoopThread("bench-broker")
        cfg = BrokerConfig.load(None, listen="127.0.0.1:0", store=str(store), metrics_listen="127.0.0.1:0",
                                enable_property_filter=True, **settings)
        self.broker = BrokerController(cfg)
        self.loop.run(self.broker.start(), 60)
        self.client = SyncRemotingClient(self.loop)

    def call(self, code: int, fields: dict[str, Any], body: bytes = b"") -> RemotingCommand:
        r = self.client.invoke(self.broker.address, RemotingCommand.request(code, fields, body), 10.0)
        if r.code != 0:
            raise RuntimeError(f"request {code} refused: {r.remark}")
        return r

    def scrape(self) -> bool:
        """One scrape; False when it failed (a count slower than the scrape timeout answers HTTP 500)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.broker.metrics.port}/metrics", timeout=60) as r:
                return len(r.read()) > 0
        except urllib.error.HTTPError:
            return False

    def stop(self) -> None:
        self.client.close()
        self.loop.run(self.broker.stop(), 60)
        self.loop.stop()


def fill(b: Running, groups: int, messages: int) -> None:
    """``messages`` per queue with a property ``n``, and ``groups`` SQL92 groups committed at offset 0."""
    for q in range(QUEUES):
        for i in range(messages):
            h = H.SendMessageRequestHeader(producer_group="PG", topic=TOPIC, queue_id=q,
                                           properties=P.encode_properties({"n": str(i % 10)}),
                                           born_timestamp=int(time.time() * 1000))
            b.call(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), b"x" * 100)
    for g in range(groups):
        sub = {"topic": TOPIC, "subString": f"n = {g % 10}", "expressionType": "SQL92",
               "subVersion": int(time.time() * 1000), "tagsSet": []}
        consumer = {"groupName": f"G{g}", "subscriptionDataSet": [sub], "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET"}
        b.call(RequestCode.HEART_BEAT, {}, orjson.dumps({"clientID": f"c{g}", "consumerDataSet": [consumer],
                                                         "producerDataSet": []}))
        for q in range(QUEUES):
            b.call(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": f"G{g}", "topic": TOPIC, "queueId": q,
                                                        "commitOffset": 0})


def per_scrape_ms(store: Path, scrapes: int, refresh: float | None, failed: list[int]) -> float:
    b = Running(store, **({} if refresh is None else {"metrics_lag_refresh_s": refresh}))
    try:
        b.broker.store.wait_dispatched(30.0)
        b.scrape()  # warm: both settings begin with one full count
        t0 = time.process_time()
        failed.append(sum(not b.scrape() for _ in range(scrapes)))
        return (time.process_time() - t0) / scrapes * 1000
    finally:
        b.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--groups", type=int, default=None)
    args = ap.parse_args()
    groups = args.groups or (40 if args.quick else 200)
    messages, scrapes, rounds = (200, 4, 2) if args.quick else (1000, 8, 4)
    with tempfile.TemporaryDirectory() as d:
        store = Path(d) / "store"
        b = Running(store)
        try:
            fill(b, groups, messages)
            b.broker.store.wait_dispatched(30.0)
        finally:
            b.stop()
        every: list[float] = []
        bounded: list[float] = []
        every_failed: list[int] = []
        bounded_failed: list[int] = []
        for _ in range(rounds):
            every.append(per_scrape_ms(store, scrapes, 0.0 if HAS_REFRESH else None, every_failed))
            if HAS_REFRESH:
                bounded.append(per_scrape_ms(store, scrapes, 15.0, bounded_failed))
    out = {"groups": groups, "queues": QUEUES, "messages_per_queue": messages, "scrapes": scrapes,
           "cpu_ms_per_scrape_count_every_scrape": round(statistics.median(every), 2),
           "cpu_ms_per_scrape_refresh_15s": round(statistics.median(bounded), 2) if bounded else None,
           "failed_scrapes_count_every_scrape": sum(every_failed), "failed_scrapes_refresh_15s": sum(bounded_failed)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
