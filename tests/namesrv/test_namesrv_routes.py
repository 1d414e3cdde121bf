"""RouteInfoManager: registration, routes, expiry and removal (no I/O)."""
from __future__ import annotations

from sluice.namesrv.routeinfo import RouteInfoManager
from sluice.protocol.bodies import (
    DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigSerializeWrapper, decode_body, encode_body,
)


def wrapper(*topics: tuple[str, int], counter: int = 1) -> TopicConfigSerializeWrapper:
    return TopicConfigSerializeWrapper(
        topic_config_table={t: TopicConfig(topic_name=t, read_queue_nums=n, write_queue_nums=n) for t, n in topics},
        data_version=DataVersion(timestamp=1, counter=counter))


def register(rim: RouteInfoManager, name: str, addr: str, *, bid: int = 0, cluster: str = "C", now: float = 0.0,
             topics: TopicConfigSerializeWrapper | None = None, filters: list[str] | None = None, conn: object = None):
    return rim.register_broker(cluster_name=cluster, broker_addr=addr, broker_name=name, broker_id=bid,
                               ha_server_addr=addr.replace("10911", "10912"), topic_config_wrapper=topics,
                               filter_server_list=filters or [], now=now, conn_key=conn)


def test_route_of_a_topic_on_two_brokers() -> None:
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("U", 2)), filters=["h1:30000"])
    register(rim, "b2", "h2:10911", topics=wrapper(("T", 8)))
    route = rim.pick_topic_route_data("T")
    assert route is not None
    assert encode_body(route) == (
        b'{"queueDatas":[{"brokerName":"b1","readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSynFlag":0},'
        b'{"brokerName":"b2","readQueueNums":8,"writeQueueNums":8,"perm":6,"topicSynFlag":0}],'
        b'"brokerDatas":[{"cluster":"C","brokerName":"b1","brokerAddrs":{"0":"h1:10911"}},'
        b'{"cluster":"C","brokerName":"b2","brokerAddrs":{"0":"h2:10911"}}],'
        b'"filterServerTable":{"h1:10911":["h1:30000"]}}')
    assert rim.pick_topic_route_data("nope") is None
    assert rim.all_topics().topic_list == ["T", "U"]
    info = rim.cluster_info()
    assert info.cluster_addr_table == {"C": ["b1", "b2"]} and set(info.broker_addr_table) == {"b1", "b2"}


def test_slave_registration_gets_master_addresses_and_does_not_change_queues() -> None:
    rim = RouteInfoManager()
    assert register(rim, "b1", "h1:10911", topics=wrapper(("T", 4))).master_addr is None
    result = register(rim, "b1", "h1s:10911", bid=1, topics=wrapper(("T", 16), counter=9))
    assert (result.master_addr, result.ha_server_addr) == ("h1:10911", "h1:10912")
    route = rim.pick_topic_route_data("T")
    assert route is not None and route.queue_datas[0].read_queue_nums == 4
    assert route.broker_datas[0].broker_addrs == {0: "h1:10911", 1: "h1s:10911"}


def test_queue_data_updates_only_when_the_data_version_changes() -> None:
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), counter=1))
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 8), counter=1))
    assert rim.pick_topic_route_data("T").queue_datas[0].read_queue_nums == 4  # type: ignore[union-attr]
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 8), counter=2))
    assert rim.pick_topic_route_data("T").queue_datas[0].read_queue_nums == 8  # type: ignore[union-attr]


def test_unregister_removes_broker_cluster_and_orphan_topics() -> None:
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("Only1", 1)))
    register(rim, "b2", "h2:10911", cluster="D", topics=wrapper(("T", 4)))
    rim.unregister_broker(cluster_name="C", broker_addr="h1:10911", broker_name="b1", broker_id=0)
    assert rim.pick_topic_route_data("Only1") is None
    route = rim.pick_topic_route_data("T")
    assert route is not None and [b.broker_name for b in route.broker_datas] == ["b2"]
    assert rim.cluster_info().cluster_addr_table == {"D": ["b2"]}


def test_expiry_and_connection_loss() -> None:
    rim = RouteInfoManager()
    conn_a, conn_b = object(), object()
    register(rim, "b1", "h1:10911", now=0, topics=wrapper(("T", 4)), conn=conn_a)
    register(rim, "b2", "h2:10911", now=100, topics=wrapper(("T", 4)), conn=conn_b)
    assert rim.scan_not_active_brokers(now=119, expiry=120) == []
    assert rim.scan_not_active_brokers(now=121, expiry=120) == ["h1:10911"]
    assert [b.broker_name for b in rim.pick_topic_route_data("T").broker_datas] == ["b2"]  # type: ignore[union-attr]
    assert rim.remove_brokers_of_connection(object()) == []
    assert rim.remove_brokers_of_connection(conn_b) == ["h2:10911"]
    assert rim.pick_topic_route_data("T") is None and rim.cluster_info().broker_addr_table == {}


def test_delete_topic_and_kv() -> None:
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4)))
    rim.put_kv("ORDER_TOPIC_CONFIG", "T", "b1:4")
    assert rim.pick_topic_route_data("T").order_topic_conf == "b1:4"  # type: ignore[union-attr]
    assert rim.delete_topic("T") and not rim.delete_topic("T")
    assert rim.pick_topic_route_data("T") is None
    rim.delete_kv("ORDER_TOPIC_CONFIG", "T")
    assert rim.get_kv("ORDER_TOPIC_CONFIG", "T") is None


def test_register_body_is_read_leniently() -> None:
    body = decode_body(RegisterBrokerBody, b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":"2",'
                                           b'"writeQueueNums":2,"perm":6,"attributes":{}}}},"somethingNew":1}')
    assert body.filter_server_list == [] and body.topic_config_serialize_wrapper.data_version == DataVersion()
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=body.topic_config_serialize_wrapper)
    route = rim.pick_topic_route_data("T")
    assert route is not None and route.queue_datas[0].read_queue_nums == 2


def test_an_unchanged_registration_restores_routes_deleted_here() -> None:
    """RocketMQ's broker re-registers every 30 s (registerBrokerAll with forceRegister): a route deleted at the
    namesrv comes back then, even though the broker's data version did not change; queues still present are
    left as they are."""
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("U", 2), counter=1))
    assert rim.delete_topic("T")
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("U", 8), counter=1))
    route = rim.pick_topic_route_data("T")
    assert route is not None and route.queue_datas[0].read_queue_nums == 4
    assert rim.pick_topic_route_data("U").queue_datas[0].read_queue_nums == 2  # type: ignore[union-attr]
    rim.unregister_broker(cluster_name="C", broker_addr="h1:10911", broker_name="b1", broker_id=0)
    assert rim.pick_topic_route_data("T") is None
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("U", 2), counter=1))
    assert rim.pick_topic_route_data("T") is not None and rim.pick_topic_route_data("U") is not None


def test_wipe_and_add_write_perm_of_a_broker() -> None:
    rim = RouteInfoManager()
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("U", 2)))
    register(rim, "b2", "h2:10911", topics=wrapper(("T", 8)))
    assert rim.change_write_perm("b1", writable=False) == 2
    perms = {q.broker_name: q.perm for q in rim.pick_topic_route_data("T").queue_datas}  # type: ignore[union-attr]
    assert perms == {"b1": 4, "b2": 6}
    # An unchanged registration keeps the wipe (RocketMQ's forced re-registration every 30 s does too).
    register(rim, "b1", "h1:10911", topics=wrapper(("T", 4), ("U", 2)))
    assert {q.perm for q in rim.pick_topic_route_data("U").queue_datas} == {4}  # type: ignore[union-attr]
    assert rim.change_write_perm("b1", writable=True) == 2
    assert {q.perm for q in rim.pick_topic_route_data("T").queue_datas} == {6}  # type: ignore[union-attr]
    assert rim.change_write_perm("nobody", writable=False) == 0
