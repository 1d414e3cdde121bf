"""Consumer filter data restored at broker start is compiled off the event loop (filter_data.py
``compile_restored`` on the selector compile thread), before recovery and the port open; pulls then use it."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from filtering_support import InProcessBroker, props_of, sub_data

import sluice.broker.filter_data as filter_data_module
from sluice.broker.filter_data import NOT_COMPILED, ConsumerFilterManager
from sluice.filter import BloomFilter
from sluice.protocol.codes import ResponseCode as R

BAD = "region = "  # no longer compiles (written into the file by hand, as a tightened limit would leave it)


def _write(path, entries: dict[str, tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"filterDataByTopic": {"T": {"groupFilterData": {
        g: {"expression": e, "expressionType": t, "clientVersion": 1, "bornTime": 1, "deadTime": 0}
        for g, (t, e) in entries.items()}}}}))


def test_load_without_compiling_then_compile_on_another_thread(tmp_path) -> None:
    _write(tmp_path / "config" / "consumerFilter.json",
           {"G1": ("SQL92", "a > 1"), "G2": ("SQL92", "a > 1"), "G3": ("TAG", "TagA"), "Bad": ("SQL92", BAD)})
    m = ConsumerFilterManager(tmp_path / "config", bloom=BloomFilter(20, 32))
    assert m.load(compile=False) == 4
    assert all(m.get("T", g).selector is None and m.get("T", g).error == NOT_COMPILED for g in ("G1", "G3", "Bad"))
    assert m.sql_filters("T") == ()  # nothing uncompiled reaches the bitmap dispatcher
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.extend(m.compile_restored()))
    t.start()
    t.join(30)
    assert m.get("T", "G1").selector is None  # compile_restored changes nothing itself
    m.install_compiled(out)
    g1, g2 = m.get("T", "G1"), m.get("T", "G2")
    assert g1.selector is not None and g1.selector is g2.selector and g1.error is None  # one compilation
    assert m.get("T", "G3").selector is not None
    bad = m.get("T", "Bad")
    assert bad.selector is None and bad.error and bad.error != NOT_COMPILED
    assert {e.group for e in m.sql_filters("T")} == {"G1", "G2"}
    assert m.compile_restored() == []  # nothing left


def test_broker_start_compiles_restored_filter_data_off_the_loop(
        tmp_path, make_broker: Callable[..., InProcessBroker], monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    b1 = make_broker(store, handle=InProcessBroker)
    rpc = b1.rpc()
    for i in range(60):
        assert rpc.send("T", f"{i}".encode(), props_of(i)).code == R.SUCCESS
    exprs = {f"G{k}": f"region = 'eu' AND a > {k * 40}" for k in range(20)}
    for g, e in exprs.items():
        assert rpc.heartbeat(f"c-{g}", g, [sub_data("T", e, version=5)]).code == R.SUCCESS
    b1.stop()  # graceful: consumerFilter.json written
    path = store / "config" / "consumerFilter.json"
    doc = orjson.loads(path.read_bytes())
    doc["filterDataByTopic"]["T"]["groupFilterData"]["Bad"] = {
        "expression": BAD, "expressionType": "SQL92", "clientVersion": 1, "bornTime": 1, "deadTime": 0}
    path.write_bytes(orjson.dumps(doc))

    threads: list[str] = []
    real = filter_data_module.compile_selector

    def recording(etype: str, expression: str) -> Any:
        threads.append(threading.current_thread().name)
        return real(etype, expression)

    monkeypatch.setattr(filter_data_module, "compile_selector", recording)
    b2 = make_broker(store, handle=InProcessBroker)
    assert len(threads) == len(exprs) + 1  # each restored expression, once
    assert all(n.startswith("sluice-selector-compile") for n in threads), threads
    rpc2 = b2.rpc()
    for g in ("G0", "G7"):  # no heartbeat since the restart, no subscription in the pull: restored data applies
        k = int(g[1:])
        want = [f"{i}".encode() for i in range(60)
                if props_of(i)["region"] == "eu" and int(props_of(i)["a"]) > k * 40]
        assert rpc2.pull_all("T", group=g, inline=False) == want
    r = rpc2.pull("T", group="Bad", inline=False)
    assert r.code != R.SUCCESS and "does not compile" in r.remark and NOT_COMPILED not in r.remark
