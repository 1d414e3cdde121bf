"""Filtering through real broker subprocesses: filter data survives a restart, bitmaps survive SIGKILL,
and ``sluice admin explain`` answers "why didn't group G get message M"."""
from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest
from filtering_support import Rpc, props_of, sub_data
from servers import SluiceProcess

from sluice.admin import main as admin_main
from sluice.errors import SluiceError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.record import iter_records
from sluice.store import MessageStore, StoreConfig
from sluice.store.consumequeue_ext import is_ext_address_array
from sluice.store.message_store import read_layout

pytestmark = [pytest.mark.integration, pytest.mark.slow]
R = ResponseCode


def start_broker(tmp: Path, store: Path, *extra: str, name: str = "broker") -> SluiceProcess:
    cfg = tmp / "broker.toml"
    cfg.write_text("commitlog_file_size = 8388608\npersist_offsets_interval_ms = 500\n")
    return SluiceProcess.start(["broker", "--store", str(store), "--config", str(cfg), *extra], tmp, name=name)


def wait_for(pred, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.05)


def filtered_bodies(rpc: Rpc, topic: str, **kw) -> list[bytes]:
    out: list[bytes] = []
    off = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = rpc.pull(topic, off, **kw)
        if r.code == R.SUCCESS:
            out += [bytes(x.body) for x in iter_records(r.body)]
        elif r.code != R.PULL_RETRY_IMMEDIATELY:
            assert r.code in (R.PULL_NOT_FOUND, R.PULL_OFFSET_MOVED), (r.code, r.remark)
            break
        off = int(r.ext_fields["nextBeginOffset"])
    return out


def test_filter_data_restored_after_restart(tmp_path):
    store = tmp_path / "store"
    b = start_broker(tmp_path, store)
    rpc = Rpc(b.addr)
    try:
        for i in range(200):
            assert rpc.send("T", f"{i}".encode(), props_of(i)).code == R.SUCCESS
        assert rpc.heartbeat("c1", "G", [sub_data("T", "region = 'eu'", version=5)]).code == R.SUCCESS
        assert rpc.heartbeat("c2", "H", [sub_data("T", "TagA", "TAG", version=5)]).code == R.SUCCESS
    finally:
        rpc.close()
        b.stop()  # SIGTERM: graceful, writes consumerFilter.json
    doc = orjson.loads((store / "config" / "consumerFilter.json").read_bytes())
    assert set(doc["filterDataByTopic"]["T"]["groupFilterData"]) == {"G", "H"}
    b = start_broker(tmp_path, store, name="broker2")
    rpc = Rpc(b.addr)
    try:
        want_eu = [f"{i}".encode() for i in range(200) if props_of(i)["region"] == "eu"]
        want_a = [f"{i}".encode() for i in range(200) if props_of(i).get("TAGS") == "TagA"]
        # no heartbeat since the restart, no subscription in the pull: the restored filter data applies
        assert wait_for(lambda: filtered_bodies(rpc, "T", group="G", inline=False) == want_eu)
        assert filtered_bodies(rpc, "T", group="H", inline=False) == want_a
        assert rpc.pull("T", group="Nobody", inline=False).code == R.SUBSCRIPTION_NOT_EXIST
        assert rpc.pull("T", group="G", inline=False, sub_version=6).code == R.FILTER_DATA_NOT_LATEST
    finally:
        rpc.close()
        b.stop()


@pytest.mark.crash
def test_sigkill_while_sending_to_a_sql_topic_keeps_bitmaps_consistent(tmp_path):
    store = tmp_path / "store"
    b = start_broker(tmp_path, store)
    rpc = Rpc(b.addr)
    sent: list[int] = []
    stop = threading.Event()
    try:
        assert rpc.send("S", b"first", props_of(0)).code == R.SUCCESS
        assert rpc.heartbeat("c1", "G", [sub_data("S", "a < 300")]).code == R.SUCCESS
        assert wait_for(lambda: (store / "config" / "consumerFilter.json").exists(), 5)  # within a second

        def producer() -> None:
            i = 1
            while not stop.is_set():
                try:
                    if rpc.send("S", f"{i}".encode(), props_of(i)).code == R.SUCCESS:
                        sent.append(i)
                except SluiceError:
                    return
                i += 1

        t = threading.Thread(target=producer, daemon=True)
        t.start()
        wait_for(lambda: len(sent) > 1500, 30)
        os.kill(b.pid, signal.SIGKILL)
        stop.set()
        t.join(10)
        b.proc.wait(10)
    finally:
        rpc.close()
        b.stop()
    assert len(sent) > 100
    b = start_broker(tmp_path, store, name="broker2")
    rpc = Rpc(b.addr)
    try:
        got = filtered_bodies(rpc, "S", group="G", sub="a < 300")
        ids = [int(x) for x in got if x != b"first"]
        acked = [i for i in sent if int(props_of(i)["a"]) < 300]
        assert set(acked) <= set(ids)  # every acknowledged match is delivered (async flush: the page cache
        assert ids == sorted(ids)      # survives SIGKILL), in order, and nothing that does not match
        assert all(int(props_of(i)["a"]) < 300 for i in ids)
    finally:
        rpc.close()
        b.stop()
    # offline check: every ext address resolves, bitmaps agree with the expression
    layout = read_layout(store)
    with MessageStore(store, StoreConfig(**layout, index_enable=(store / "index").is_dir())) as s:
        assert s.check().ok
        cq = s.queues.get("S", 0)
        slots = cq.get_units(0, cq.max_offset)["tag"].astype("int64")
        assert is_ext_address_array(slots[1:]).all()  # replayed records got bitmaps too


def test_admin_explain_names_the_failing_predicate(tmp_path):
    ns = SluiceProcess.start(["namesrv"], tmp_path, name="namesrv")
    b = start_broker(tmp_path, tmp_path / "store", "--namesrv", ns.addr)
    rpc = Rpc(b.addr)
    try:
        miss = rpc.send("E", b"m", {"a": "3", "region": "eu"})
        hit = rpc.send("E", b"h", {"a": "30", "region": "eu"})
        bad = rpc.send("E", b"b", {"a": "abc", "region": "eu"})
        assert rpc.heartbeat("c1", "G", [sub_data("E", "region = 'eu' AND a > 10")]).code == R.SUCCESS
        runs = {}
        for name, resp in (("miss", miss), ("hit", hit), ("bad", bad)):
            out, err = io.StringIO(), io.StringIO()
            status = admin_main(["explain", "-n", ns.addr, "--json", "-i", resp.ext_fields["msgId"], "-g", "G"],
                                {}, stdout=out, stderr=err)
            assert int(status) == 0, err.getvalue()
            runs[name] = orjson.loads(out.getvalue())
        assert runs["hit"]["matched"] is True
        assert runs["miss"]["matched"] is False and runs["miss"]["predicate"] == "a > 10"
        assert runs["miss"]["predicateOutcome"] == "FALSE"
        assert runs["bad"]["outcome"] == "ERROR" and runs["bad"]["error"]
        text = io.StringIO()
        admin_main(["explain", "-n", ns.addr, "-i", miss.ext_fields["msgId"], "-g", "G"], {}, stdout=text,
                   stderr=io.StringIO())
        assert "a > 10" in text.getvalue()
    finally:
        rpc.close()
        b.stop()
        ns.stop()
