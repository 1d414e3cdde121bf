"""Durability end to end: a `--flush sync` broker killed with SIGKILL mid-traffic loses no acknowledged send,
single or batch."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker_support import Rpc, records
from servers import SluiceProcess
from sluice.errors import SluiceError
from sluice.protocol.codes import RequestCode, ResponseCode

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.integration]
R = ResponseCode
QUEUES = 4
PRODUCERS = 4
BATCH = 8


def _produce(addr: str, n: int, stop: threading.Event, acked: list, errors: list) -> None:
    rpc = Rpc(addr)
    try:
        seq = 0
        while not stop.is_set():
            body = f"p{n}-{seq}".encode() + b"." * 200
            # Every third send is a batch of BATCH (encoded straight to records, its reply after the fsync).
            batch = [body + b"#%d" % i for i in range(BATCH)] if seq % 3 == 2 else None
            try:
                if batch is None:
                    resp = rpc.send("Durable", body, queue_id=seq % QUEUES)
                else:
                    resp = rpc.send_batch("Durable", [(b, {}, 0) for b in batch], queue_id=seq % QUEUES)
            except SluiceError as exc:  # the broker died under us: that send is not acknowledged
                errors.append(str(exc))
                return
            if resp.code == R.SUCCESS:
                qid, first = int(resp.ext_fields["queueId"]), int(resp.ext_fields["queueOffset"])
                acked.extend((qid, first + i, b) for i, b in enumerate(batch or [body]))
            seq += 1
    finally:
        rpc.close()


def _drain(rpc: Rpc, queue_id: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        resp = rpc.pull("Durable", queue_id, offset, max_msgs=256)
        if resp.code != R.SUCCESS:
            assert resp.code == R.PULL_NOT_FOUND, (resp.code, resp.remark)
            return out
        for rec in records(resp):
            out.append((rec.queue_offset, bytes(rec.body)))
        offset = int(resp.ext_fields["nextBeginOffset"])


def test_sigkill_loses_no_acknowledged_send(tmp_path: Path):
    store = tmp_path / "store"
    args = ["broker", "--store", str(store), "--flush", "sync"]
    broker = SluiceProcess.start(args, tmp_path, name="broker")
    try:
        setup = Rpc(broker.addr)
        assert setup.call(RequestCode.UPDATE_AND_CREATE_TOPIC,
                          dict(topic="Durable", readQueueNums=QUEUES, writeQueueNums=QUEUES, perm=6)).code == 0
        setup.close()
        stop = threading.Event()
        acked: list[tuple[int, int, bytes]] = []
        errors: list[str] = []
        threads = [threading.Thread(target=_produce, args=(broker.addr, n, stop, acked, errors))
                   for n in range(PRODUCERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while len(acked) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        broker.kill()  # SIGKILL while the producers are still sending
        stop.set()
        for t in threads:
            t.join(30)
        assert len(acked) >= 300, f"only {len(acked)} sends acknowledged before the kill"
    finally:
        broker.kill()

    restarted = SluiceProcess.start(args, tmp_path, name="broker-restarted")
    try:
        rpc = Rpc(restarted.addr)
        stored: dict[tuple[int, int], bytes] = {}
        for qid in range(QUEUES):
            got = _drain(rpc, qid)
            offsets = [o for o, _ in got]
            assert offsets == list(range(len(offsets))), f"queue {qid}: gaps or duplicates in {offsets[:20]}..."
            stored.update({(qid, o): b for o, b in got})
        lost = [(q, o) for q, o, b in acked if stored.get((q, o)) != b]
        assert not lost, f"{len(lost)} acknowledged sends missing or different after the crash: {lost[:5]}"
        # Every stored body is unique: no message was stored twice.
        assert len(set(stored.values())) == len(stored)
        rpc.close()
    finally:
        restarted.stop()
