"""Class-filter mode on the client: MessageSelector.by_class, the 302 request, filter-server choice, and a
consumer whose broker runs no filter server (a loud FilterClassError, never a pull from the broker)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import zlib

import pytest

from sluice import MessageSelector
from sluice.client.class_filter import (
    FLAG_CLASS_FILTER, ClassFilters, class_error, filter_servers_of, register_filter_class_request,
)
from sluice.client.instance import ClientInstance
from sluice.client.pull_consumer import AsyncPullConsumer
from sluice.client.push_consumer import AsyncPushConsumer
from sluice.client.results import MessageQueue
from sluice.errors import (
    FilterClassConflictError, FilterClassError, FilterClassFailedError, FilterClassImportError,
    FilterClassNotFoundError, FilterClassUploadRefusedError, FilterError, InvalidParameterError,
)
from sluice.protocol.bodies import BrokerData, QueueData, SubscriptionData, TopicRouteData, decode_body, encode_body
from sluice.protocol.codes import RequestCode

from sdk_support import cluster, needs_broker, topic  # noqa: F401 (fixtures)

SOURCE = "from sluice.filter import MessageFilter\n\nclass Even(MessageFilter):\n    def match(self, m):\n" \
         "        return int(m.properties['n']) % 2 == 0\n"


# ------------------------------------------------------------------------------------------------ selector

def test_by_class_names_and_crc():
    s = MessageSelector.by_class("filters.even:Even", SOURCE)
    assert s.is_class and not s.is_tag and s.expression == "filters.even:Even"
    assert s.class_source == SOURCE.encode() and s.class_crc == zlib.crc32(SOURCE.encode()) & 0x7FFFFFFF
    assert s.wire_expression_type == "TAG" and s.tags == frozenset()
    b = MessageSelector.by_class("filters.even:Even", SOURCE.encode())
    assert b == s and hash(b) == hash(s)
    none = MessageSelector.by_class("filters.even:Even")
    assert none.class_source == b"" and none.class_crc == 0 and none != s  # another CRC: another registration
    assert MessageSelector.by_class("even:Even") != MessageSelector.by_tag("even:Even")
    assert "filters.even:Even" in repr(s) and "bytes" in repr(s)


@pytest.mark.parametrize("name", ["Even", "mod.Even", "mod:", ":Even", "mod:Ev en", "1mod:Even", "mod:Even.x",
                                  "", "mod:Even:More"])
def test_by_class_refuses_bad_names(name: str):
    with pytest.raises(InvalidParameterError, match="module:ClassName"):
        MessageSelector.by_class(name)


def test_by_class_refuses_other_sources():
    with pytest.raises(InvalidParameterError, match="str or bytes"):
        MessageSelector.by_class("m:C", 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="by_class"):
        MessageSelector("CLASS", "m:C")


def test_subscription_data_is_rocketmq_class_mode():
    d = MessageSelector.by_class("filters.even:Even", SOURCE).subscription_data("T", 7)
    assert (d.topic, d.sub_string, d.class_filter_mode, d.tags_set, d.code_set, d.sub_version,
            d.expression_type) == ("T", "filters.even:Even", True, [], [], 7, "TAG")
    wire = encode_body(d)
    assert b'"classFilterMode":true' in wire and b"filterClassError" not in wire  # left out while None
    d = dataclasses.replace(d, filter_class_error="filter class 'filters.even:Even': boom")
    assert decode_body(SubscriptionData, encode_body(d)).filter_class_error == d.filter_class_error
    assert MessageSelector.by_tag("A").subscription_data("T", 1).class_filter_mode is False


# ------------------------------------------------------------------------------------------------ wire pieces

def test_register_request_carries_group_topic_class_crc_and_source():
    s = MessageSelector.by_class("filters.even:Even", SOURCE)
    r = register_filter_class_request("G", "T", s)
    assert r.code == RequestCode.REGISTER_MESSAGE_FILTER_CLASS
    assert r.ext_fields == {"consumerGroup": "G", "topic": "T", "className": "filters.even:Even",
                            "classCRC": str(s.class_crc)}
    assert r.body == SOURCE.encode()
    r0 = register_filter_class_request("G", "T", MessageSelector.by_class("m:C"))
    assert r0.ext_fields["classCRC"] == "0" and r0.body == b""


def test_filter_servers_of_route():
    route = TopicRouteData(filter_server_table={"127.0.0.1:10911": ["127.0.0.1:3001", "127.0.0.1:3002"]})
    assert filter_servers_of(route, "127.0.0.1:10911") == ["127.0.0.1:3001", "127.0.0.1:3002"]
    assert filter_servers_of(route, "127.0.0.1:10912") == []
    assert filter_servers_of(None, "127.0.0.1:10911") == []


def test_class_error_names_class_and_cause():
    e = class_error("m:C", "ZeroDivisionError: division by zero", code=1, where="filter server x")
    assert isinstance(e, FilterError) and e.class_name == "m:C" and e.cause.startswith("ZeroDivisionError")
    assert "'m:C'" in str(e) and "division by zero" in str(e) and "filter server x" in str(e) and e.code == 1
    assert type(e) is FilterClassFailedError
    # a filter server's remark names the class already: not twice
    named = class_error("m:C", "filter class 'm:C' failed: raised ValueError", code=1)
    assert str(named) == "filter class 'm:C' failed: raised ValueError"
    for code, cls in [(16, FilterClassUploadRefusedError), (27, FilterClassNotFoundError),
                      (23, FilterClassImportError), (25, FilterClassConflictError), (29, FilterClassError)]:
        got = class_error("m:C", "x", code=code)
        assert type(got) is cls and got.code == code
    assert type(class_error("m:C", "no filter server")) is FilterClassError


def _route(broker_addr: str, servers: list[str]) -> TopicRouteData:
    return TopicRouteData(queue_datas=[QueueData(broker_name="broker-a", read_queue_nums=2, write_queue_nums=2,
                                                 perm=6)],
                          broker_datas=[BrokerData(cluster="c", broker_name="broker-a", broker_addrs={0: broker_addr})],
                          filter_server_table={broker_addr: servers} if servers else {})


def test_pick_chooses_among_the_brokers_filter_servers_only():
    async def main() -> None:
        inst = ClientInstance(["127.0.0.1:1"])
        try:
            chosen: list[list[str]] = []

            def rng(options: list[str]) -> str:
                chosen.append(options)
                return options[-1]
            filters = ClassFilters(inst, rng=rng)
            inst._set_route("T", _route("127.0.0.1:10911", ["127.0.0.1:3002", "127.0.0.1:3001"]))
            mq = MessageQueue(topic="T", broker_name="broker-a", queue_id=1)
            sel = MessageSelector.by_class("m:C")
            assert await filters.pick(mq, sel) == "127.0.0.1:3002"
            assert chosen == [["127.0.0.1:3001", "127.0.0.1:3002"]]
            inst._set_route("T", _route("127.0.0.1:10911", []))
            with pytest.raises(FilterClassError) as info:  # the stale route cannot be refreshed either
                await filters.pick(mq, sel)
            assert "no filter server runs beside broker broker-a (127.0.0.1:10911)" in str(info.value)
            assert info.value.class_name == "m:C"
        finally:
            await inst.close()
    asyncio.run(main())


def test_errors_are_kept_per_group_and_topic_and_logged_once(caplog: pytest.LogCaptureFixture):
    async def main() -> None:
        inst = ClientInstance(["127.0.0.1:1"])
        try:
            filters = ClassFilters(inst)
            err = class_error("m:C", "ValueError: bad")
            with caplog.at_level(logging.WARNING, logger="sluice.client.class_filter"):
                filters.note_error("G", "T", err)
                filters.note_error("G", "T", class_error("m:C", "ValueError: bad"))
            assert filters.last_error("G", "T") is not None and filters.last_error("G", "U") is None
            assert sum("ValueError: bad" in r.getMessage() for r in caplog.records) == 1
            filters.note_ok("G", "T")
            assert filters.last_error("G", "T") is None
            filters.note_error("G", "T", err)
            filters.forget("G")
            assert filters.last_error("G", "T") is None
        finally:
            await inst.close()
    asyncio.run(main())


def test_class_filter_flag_is_rocketmqs():
    assert FLAG_CLASS_FILTER == 0x8


# ------------------------------------------------------------------------------------------------ real broker

@needs_broker
def test_pull_consumer_without_filter_server_raises(cluster, topic: str):  # noqa: F811
    from servers import wait_for_route
    from sluice import Producer
    with Producer("p_" + topic, namesrv=cluster.ns) as p:
        from sluice.message import Message
        p.send(Message(topic, b"x", properties={"n": "2"}))
    wait_for_route(cluster.ns, topic)

    async def main() -> None:
        async with AsyncPullConsumer("g_" + topic, namesrv=cluster.ns) as c:
            sel = MessageSelector.by_class("filters.even:Even", SOURCE)
            mq = (await c.fetch_message_queues(topic))[0]
            with pytest.raises(FilterClassError) as info:
                await c.pull(mq, sel, 0)
            assert "filters.even:Even" in str(info.value) and "no filter server runs beside broker" in str(
                info.value)
            assert c.class_filter_error(topic) is not None
            assert c.class_filters() == {topic: sel}
            data = c.consumer_data().subscription_data_set[0]
            assert data.class_filter_mode and data.filter_class_error and "no filter server" in \
                data.filter_class_error
    asyncio.run(main())


@needs_broker
def test_push_consumer_without_filter_server_surfaces_the_error(cluster, topic: str):  # noqa: F811
    from servers import wait_for_route
    from sluice import Producer
    from sluice.message import Message
    with Producer("p_" + topic, namesrv=cluster.ns) as p:
        p.send(Message(topic, b"x", properties={"n": "2"}))
    wait_for_route(cluster.ns, topic)
    got: list[bytes] = []

    async def main() -> None:
        c = AsyncPushConsumer("g_" + topic, namesrv=cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                              pull_time_delay_when_exception=0.2)
        c.subscribe(topic, MessageSelector.by_class("filters.even:Even", SOURCE))
        c.register_listener(lambda msgs: got.extend(m.body for m in msgs) or 0)
        await c.start()
        try:
            for _ in range(200):
                if c.class_filter_error(topic) is not None:
                    break
                await asyncio.sleep(0.05)
            err = c.class_filter_error(topic)
            assert err is not None and "no filter server runs beside broker" in str(err)
        finally:
            await c.shutdown()
    asyncio.run(main())
    assert got == []  # never served by the broker, unfiltered
