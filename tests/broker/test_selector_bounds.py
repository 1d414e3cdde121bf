"""Selectors never hold the event loop for long: new SQL92 subscriptions compile off the loop (cached ones take
the plain-handler path), new compilations are bounded per connection, and a pull evaluates a bounded number of
records, going on exactly where it stopped."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from filtering_support import InProcessBroker, sub_data

import sluice.broker.selector_compile as sc
from sluice.filter import compile_cache
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import iter_records

R = ResponseCode


@pytest.fixture
def make_broker(make_broker):
    return partial(make_broker, handle=InProcessBroker)


@pytest.fixture(autouse=True)
def fresh_compile_cache():
    """Each test's broker starts with nothing compiled: an expression another test compiled in this process
    (compile_selector's cache is the process's) would be built on the loop, not compiled off it."""
    compile_cache.clear()
    yield
    compile_cache.clear()


def big_selector(k: int, terms: int = 400) -> str:
    return " OR ".join(f"a = {k * 10_000 + i}" for i in range(terms))


def bodies(r: RemotingCommand) -> list[bytes]:
    return [bytes(rec.body) for rec in iter_records(r.body)] if r.code == R.SUCCESS else []


def test_a_compile_storm_does_not_stall_a_normal_client(make_broker, monkeypatch):
    """While the compile thread is held inside a new selector's compilation, the loop still answers a ping and
    a pull with an already-compiled selector (with compilation on the loop, both would wait for it)."""
    b = make_broker()
    rpc = b.rpc()
    assert rpc.send("T", b"m0", {"a": "1"}).code == R.SUCCESS
    assert bodies(rpc.pull("T", sub="a > 0")) == [b"m0"]  # compiled now: the fast path from here on
    gate, entered = threading.Event(), threading.Event()
    real = sc.compile_subscription

    def held_compile(*args, **kw):
        entered.set()
        gate.wait(20)
        return real(*args, **kw)

    monkeypatch.setattr(sc, "compile_subscription", held_compile)
    compiler = b.broker.pull_processor.compiler
    storm = 12
    base = compiler.compiled
    clients = [b.rpc() for _ in range(4)]
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(clients[k % 4].pull, "T", sub=big_selector(k)) for k in range(storm)]
        try:
            assert entered.wait(10), "no compilation started"
            other = b.rpc()
            ping = other.call(RequestCode.GET_BROKER_RUNTIME_INFO)
            normal = other.pull("T", sub="a > 0")
            assert ping.code == R.SUCCESS and bodies(normal) == [b"m0"]
            assert compiler.compiled == base and not any(f.done() for f in futs)  # the storm is still under way
        finally:
            gate.set()
        codes = [f.result(30).code for f in futs]
    assert all(c in (R.SUCCESS, R.PULL_RETRY_IMMEDIATELY) for c in codes), codes
    assert compiler.compiled == base + storm


def slow_pull(rpc, sub: str) -> RemotingCommand:
    """An inline SQL92 pull waiting up to a minute (the compile thread may have many selectors ahead)."""
    return rpc.call(RequestCode.PULL_MESSAGE, dict(
        consumerGroup="G", topic="T", queueId=0, queueOffset=0, maxMsgNums=32, sysFlag=0x4, commitOffset=0,
        suspendTimeoutMillis=0, subVersion=0, subscription=sub, expressionType="SQL92"), timeout=60.0)


@pytest.mark.slow
def test_real_expensive_selectors_leave_the_loop_free(make_broker):
    """Real 400-term selectors, sent together: a ping sent after them is answered before they are all compiled."""
    b = make_broker()
    rpc = b.rpc()
    assert rpc.send("T", b"m0", {"a": "1"}).code == R.SUCCESS
    compiler = b.broker.pull_processor.compiler
    storm = 64
    clients = [b.rpc() for _ in range(16)]
    with ThreadPoolExecutor(16) as ex:
        futs = [ex.submit(slow_pull, clients[k % 16], big_selector(k)) for k in range(storm)]
        deadline = time.monotonic() + 30
        while compiler.compiled == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert rpc.call(RequestCode.GET_BROKER_RUNTIME_INFO).code == R.SUCCESS
        done_at_ping = compiler.compiled
        codes = [f.result(120).code for f in futs]
    assert all(c in (R.SUCCESS, R.PULL_RETRY_IMMEDIATELY) for c in codes), codes
    assert done_at_ping < storm == compiler.compiled


def test_new_compilations_are_bounded_per_connection(make_broker):
    b = make_broker(max_selector_compiles_per_client_per_minute=3)
    rpc = b.rpc()
    assert rpc.send("T", b"m0", {"a": "1"}).code == R.SUCCESS
    for k in range(3):
        assert rpc.pull("T", sub=f"a > {k}").code in (R.SUCCESS, R.PULL_RETRY_IMMEDIATELY)
    refused = rpc.pull("T", sub="a > 99")
    assert refused.code == R.SYSTEM_BUSY
    assert "max_selector_compiles_per_client_per_minute" in refused.remark and "at most 3" in refused.remark
    hb = rpc.heartbeat("c1", "G", [sub_data("T", "a > 98")])
    assert hb.code == R.SYSTEM_BUSY and "max_selector_compiles_per_client_per_minute" in hb.remark
    # already compiled selectors and TAG subscriptions cost no compilation: still served
    assert bodies(rpc.pull("T", sub="a > 0")) == [b"m0"]
    assert bodies(rpc.pull("T", sub="*", expr_type="TAG")) == [b"m0"]
    # another connection has its own allowance, and the selector it compiled is then cached for everyone
    other = b.rpc()
    assert other.pull("T", sub="a > 99").code == R.PULL_RETRY_IMMEDIATELY
    assert rpc.pull("T", sub="a > 99").code == R.PULL_RETRY_IMMEDIATELY
    assert b.broker.pull_processor.compiler.refused == 2


def test_a_bad_expression_is_still_a_parse_failure_and_charged_once(make_broker):
    b = make_broker(max_selector_compiles_per_client_per_minute=2)
    rpc = b.rpc()
    assert rpc.send("T", b"m0", {"a": "1"}).code == R.SUCCESS
    for _ in range(5):  # the compile error is cached: repeating it costs no new compilation
        r = rpc.pull("T", sub="a >")
        assert r.code == R.SUBSCRIPTION_PARSE_FAILED, (r.code, r.remark)
    assert rpc.pull("T", sub="a > 0").code == R.SUCCESS


def test_one_compilation_serves_concurrent_requests_for_the_same_expression(make_broker, monkeypatch):
    b = make_broker(max_selector_compiles_per_client_per_minute=1)
    rpc = b.rpc()
    assert rpc.send("T", b"m0", {"a": "1"}).code == R.SUCCESS
    assert b.broker.store.wait_dispatched(5.0)
    gate, entered = threading.Event(), threading.Event()
    real = sc.compile_subscription
    calls = []

    def held_compile(*args, **kw):
        calls.append(args)
        entered.set()
        gate.wait(20)
        return real(*args, **kw)

    monkeypatch.setattr(sc, "compile_subscription", held_compile)
    conn = _Conn()  # one connection, allowed one compilation: the waiters are not charged
    compiler = b.broker.pull_processor.compiler

    async def storm():
        tasks = [asyncio.ensure_future(compiler.compile(conn.attributes, conn.peer, "T", "SQL92", "a > 0", 0, True))
                 for _ in range(6)]
        await asyncio.sleep(0)
        return tasks

    async def finish(tasks):
        return await asyncio.gather(*tasks)

    tasks = b.loop.run(storm(), 10)
    assert entered.wait(10)
    gate.set()
    subs = b.loop.run(finish(tasks), 10)
    assert len(calls) == 1 and all(s is subs[0] for s in subs)


def test_the_evaluation_budget_stops_a_pull_and_the_next_goes_on_exactly(make_broker):
    b = make_broker(max_evaluations_per_pull=5)
    rpc = b.rpc()
    for i in range(50):
        assert rpc.send("T", f"m{i}".encode(), {"a": str(i)}).code == R.SUCCESS
    sub = "a < 3 OR a >= 40"
    first = rpc.pull("T", sub=sub)
    assert bodies(first) == [b"m0", b"m1", b"m2"]
    assert first.ext_fields["nextBeginOffset"] == "5"  # after the 5 records evaluated, not the whole window
    second = rpc.pull("T", 5, sub=sub)
    assert second.code == R.PULL_RETRY_IMMEDIATELY and second.ext_fields["nextBeginOffset"] == "10"
    metrics = b.broker.filter_data.metrics_of("G", "T")
    before = metrics.evaluated
    got = rpc.pull_all("T", sub=sub)
    assert got == [f"m{i}".encode() for i in [0, 1, 2, *range(40, 50)]]  # nothing lost, nothing twice
    assert metrics.evaluated - before == 50  # every record evaluated exactly once


def test_the_budget_bounds_a_pull_over_many_units(make_broker):
    """With no match for a long way, a pull still stops after its budget (the wider scan obeys it too)."""
    b = make_broker(max_evaluations_per_pull=100)
    rpc = b.rpc()
    for i in range(400):
        assert rpc.send("T", f"m{i}".encode(), {"a": str(i)}).code == R.SUCCESS
    metrics = b.broker.filter_data.metrics_of("G", "T")
    r = rpc.pull("T", sub="a = 399")
    assert r.code == R.PULL_RETRY_IMMEDIATELY and r.ext_fields["nextBeginOffset"] == "100"
    assert metrics.evaluated == 100
    assert rpc.pull_all("T", sub="a = 399") == [b"m399"]


class _Conn:
    peer = "test"

    def __init__(self) -> None:
        self.attributes: dict = {}


def test_compiled_selectors_take_the_plain_handler_path(make_broker):
    b = make_broker()
    rpc = b.rpc()
    assert rpc.send("T", b"m0", {"a": "1"}).code == R.SUCCESS
    assert b.broker.store.wait_dispatched(5.0)
    pp = b.broker.pull_processor

    def request(sub: str) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.PULL_MESSAGE, dict(
            consumerGroup="G", topic="T", queueId=0, queueOffset=0, maxMsgNums=32, sysFlag=0x4, commitOffset=0,
            suspendTimeoutMillis=0, subVersion=0, subscription=sub, expressionType="SQL92"))

    async def handle(sub: str):
        return await handle_version(sub, 0)

    async def handle_version(sub: str, version: int):
        req = request(sub)
        req.ext_fields["subVersion"] = str(version)
        out = pp.handle(_Conn(), req)
        if isinstance(out, RemotingCommand):
            return "plain", out
        try:
            return "coroutine", await out
        except Exception as exc:  # the gate turns a handler's error into its response code
            return "coroutine", exc

    kind, first = b.loop.run(handle("a > 0"), 10)
    assert kind == "coroutine" and bodies(first) == [b"m0"]  # new: compiled off the loop
    kind, again = b.loop.run(handle("a > 0"), 10)
    assert kind == "plain" and bodies(again) == [b"m0"]  # cached: answered at once, no task, no thread
    assert pp.compiler.compiled == 1
    # Another subscription version (a consumer restarted) or group of an expression compiled already: the
    # subscription is built on the loop, with no compilation and no thread (a consumer's start waits for it).
    kind, other_version = b.loop.run(handle_version("a > 0", 7), 10)
    assert kind == "plain" and bodies(other_version) == [b"m0"]
    assert pp.compiler.compiled == 1
    kind, bad = b.loop.run(handle_version("a >", 8), 10)  # a new expression still goes to the thread
    assert kind == "coroutine" and getattr(bad, "code", None) == R.SUBSCRIPTION_PARSE_FAILED


def test_the_budget_bounds_a_retry_topic_pull_too(make_broker):
    """%RETRY%<group> pulls evaluate each message on the group's subscription of its original topic."""
    b = make_broker(max_evaluations_per_pull=4)
    rpc = b.rpc()
    assert rpc.send("T", b"x", {"a": "-1"}).code == R.SUCCESS
    assert rpc.heartbeat("c1", "G", [sub_data("T", "a >= 10")]).code == R.SUCCESS
    for i in range(20):
        assert rpc.send("%RETRY%G", f"r{i}".encode(), {"a": str(i), "RETRY_TOPIC": "T"}).code == R.SUCCESS
    first = rpc.pull("%RETRY%G", sub="*", expr_type="TAG")
    assert first.code == R.PULL_RETRY_IMMEDIATELY and first.ext_fields["nextBeginOffset"] == "4"
    got = rpc.pull_all("%RETRY%G", sub="*", expr_type="TAG")
    assert got == [f"r{i}".encode() for i in range(10, 20)]
