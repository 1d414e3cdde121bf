"""A real `sluice namesrv` subprocess driven over TCP the way brokers and clients drive RocketMQ's."""
from __future__ import annotations

import dataclasses
import json
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import SluiceProcess

from sluice.errors import RemotingError, TopicNotExistError
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol.bodies import TopicConfig
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand, SerializeType
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame
from sluice.transport.blocking import SyncRemotingClient

pytestmark = pytest.mark.integration

EXPIRY = 1.5

# What a Java 4.x broker sends (fastjson, keys sorted, extra fields the namesrv must ignore).
REGISTER_BODY = {
    "filterServerList": ["127.0.0.1:30001"],
    "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 3, "timestamp": 1700000000000},
        "topicConfigTable": {
            "Orders": {"order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
                       "topicName": "Orders", "topicSysFlag": 0, "writeQueueNums": 4, "attributes": {}},
            "%RETRY%G": {"order": False, "perm": 6, "readQueueNums": 1, "topicFilterType": "SINGLE_TAG",
                         "topicName": "%RETRY%G", "topicSysFlag": 0, "writeQueueNums": 1},
        },
    },
}


def register_request(name: str = "broker-a", addr: str = "127.0.0.1:10911", broker_id: int = 0) -> RemotingCommand:
    ext = {"brokerName": name, "brokerAddr": addr, "clusterName": "DefaultCluster",
           "haServerAddr": addr.replace("10911", "10912"), "brokerId": str(broker_id), "compressed": "false",
           "bodyCrc32": "0"}
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, json.dumps(REGISTER_BODY).encode())


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "AccessKey": "", "OnsChannel": "ALIYUN"})


@pytest.fixture
def namesrv(tmp_path: Path) -> Iterator[SluiceProcess]:
    with SluiceProcess.start(["namesrv", "--broker-expiry", str(EXPIRY), "--scan-interval", "0.2",
                              "--max-frame-size", "1048576", "--log-level", "debug"], tmp_path) as proc:
        yield proc


def raw_exchange(addr: str, payload: bytes, timeout: float = 5.0) -> tuple[list[RemotingCommand], bool]:
    """Send bytes on a fresh socket; return the frames received and whether the server closed it."""
    host, port = addr.rsplit(":", 1)
    codec = FrameCodec()
    frames: list[RemotingCommand] = []
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(payload)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except TimeoutError:
                return frames, False
            if not data:
                return frames, True
            codec.receive_data(data)
            while (frame := codec.next_frame()) is not NEED_DATA:
                frames.append(frame)  # type: ignore[arg-type]
            if frames:
                return frames, False
    return frames, False


def test_register_route_expire_unregister(namesrv: SluiceProcess) -> None:
    with SyncRemotingClient() as broker, SyncRemotingClient() as client:
        resp = broker.invoke(namesrv.addr, register_request(), 5)
        assert resp.code == ResponseCode.SUCCESS and resp.is_response

        route = client.invoke(namesrv.addr, route_request("Orders"), 5)
        assert route.code == 0
        body = json.loads(route.body)  # exactly the shape clients parse
        assert body == {
            "queueDatas": [{"brokerName": "broker-a", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                            "topicSynFlag": 0}],
            "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "broker-a",
                             "brokerAddrs": {"0": "127.0.0.1:10911"}}],
            "filterServerTable": {"127.0.0.1:10911": ["127.0.0.1:30001"]},
        }

        # a slave of broker-a learns its master's addresses
        slave = broker.invoke(namesrv.addr, register_request(addr="127.0.0.2:10911", broker_id=1), 5)
        assert slave.ext_fields == {"masterAddr": "127.0.0.1:10911", "haServerAddr": "127.0.0.1:10912"}

        missing = client.invoke(namesrv.addr, route_request("NoSuchTopic"), 5)
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST == 17 and "NoSuchTopic" in (missing.remark or "")

        # silence: both registrations expire, though the broker's connection stays open
        deadline = time.monotonic() + EXPIRY + 5
        while client.invoke(namesrv.addr, route_request("Orders"), 5).code == 0:
            assert time.monotonic() < deadline, "broker never expired"
            time.sleep(0.1)
        assert client.invoke(namesrv.addr, route_request("%RETRY%G"), 5).code == ResponseCode.TOPIC_NOT_EXIST

        assert broker.invoke(namesrv.addr, register_request(), 5).code == 0
        assert client.invoke(namesrv.addr, route_request("Orders"), 5).code == 0
        unreg = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, {
            "brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": "DefaultCluster", "brokerId": "0"})
        assert broker.invoke(namesrv.addr, unreg, 5).code == 0
        assert client.invoke(namesrv.addr, route_request("Orders"), 5).code == ResponseCode.TOPIC_NOT_EXIST
    namesrv.wait_for_stderr("expired")


def test_broker_removed_when_its_connection_closes(namesrv: SluiceProcess) -> None:
    with SyncRemotingClient() as client:
        with SyncRemotingClient() as broker:
            assert broker.invoke(namesrv.addr, register_request(), 5).code == 0
            assert client.invoke(namesrv.addr, route_request("Orders"), 5).code == 0
        deadline = time.monotonic() + 5
        while client.invoke(namesrv.addr, route_request("Orders"), 5).code == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_namesrv_client_helpers(namesrv: SluiceProcess) -> None:
    with SyncNamesrvClient(f"127.0.0.1:1;{namesrv.addr}", timeout=3) as ns:  # the first one is dead: fail over
        [bad, good] = ns.register_broker(cluster_name="C1", broker_name="b1", broker_addr="127.0.0.1:20911",
                                         topics=[TopicConfig(topic_name="T1", read_queue_nums=2, write_queue_nums=2)])
        assert not bad.ok and good.ok and good.header is not None and good.header.master_addr is None
        route = ns.get_route("T1")
        assert route.broker_datas[0].select_broker_addr() == "127.0.0.1:20911"
        assert route.queue_datas[0].read_queue_nums == 2
        assert ns.get_all_topics() == ["T1"]
        info = ns.get_cluster_info()
        assert info.cluster_addr_table == {"C1": ["b1"]} and info.broker_addr_table["b1"].broker_addrs == {0: "127.0.0.1:20911"}
        assert ns.get_kv("NS", "k") is None
        with pytest.raises(RemotingError, match="cannot connect to 127.0.0.1:1"):
            ns.put_kv("NS", "k", "v")  # the dead namesrv makes a broadcast fail loudly
    with SyncNamesrvClient(namesrv.addr) as ns:
        ns.put_kv("NS", "k", "v")
        assert ns.get_kv("NS", "k") == "v"
        ns.delete_kv("NS", "k")
        assert ns.get_kv("NS", "k") is None
        ns.delete_topic("T1")
        with pytest.raises(TopicNotExistError, match="T1"):
            ns.get_route("T1")
        assert all(o.ok for o in ns.unregister_broker(cluster_name="C1", broker_name="b1", broker_addr="127.0.0.1:20911"))
        assert ns.get_cluster_info().broker_addr_table == {}


@pytest.mark.parametrize("payload", [
    b"\x00\x00\x00\x0c\x00\x00\x00\x08not-json",
    struct.pack(">i", 2 * 1024 * 1024) + b"\x00" * 64,  # over the 1 MiB limit given on the command line
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS ClientHello
    b"\x00\x00\x00\x05\x05\x00\x00\x00x",  # unknown serialize type
])
def test_hostile_bytes_close_that_connection_and_the_server_keeps_serving(namesrv: SluiceProcess, payload: bytes) -> None:
    frames, closed = raw_exchange(namesrv.addr, payload)
    assert frames == [] and closed
    frames, _ = raw_exchange(namesrv.addr, encode_frame(route_request("X")))
    assert frames[0].code == ResponseCode.TOPIC_NOT_EXIST and namesrv.alive()


def test_bad_requests_are_answered(namesrv: SluiceProcess) -> None:
    frames, _ = raw_exchange(namesrv.addr, encode_frame(RemotingCommand.request(9999).with_opaque(77)))
    assert frames[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in (frames[0].remark or "")
    assert frames[0].opaque == 77 and frames[0].is_response
    frames, _ = raw_exchange(namesrv.addr, encode_frame(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC)))
    assert frames[0].code == ResponseCode.INVALID_PARAMETER and "topic" in (frames[0].remark or "")
    bad_body = RemotingCommand.request(RequestCode.REGISTER_BROKER, register_request().ext_fields, b"{not json")
    frames, _ = raw_exchange(namesrv.addr, encode_frame(bad_body))
    assert frames[0].code == ResponseCode.INVALID_PARAMETER
    # the ROCKETMQ binary header works too, and is answered in kind
    binary = dataclasses.replace(route_request("X"), serialize_type=SerializeType.ROCKETMQ)
    frames, _ = raw_exchange(namesrv.addr, encode_frame(binary))
    assert frames[0].code == ResponseCode.TOPIC_NOT_EXIST and frames[0].serialize_type == SerializeType.ROCKETMQ


def test_config_file_flags_win_and_sigterm_stops_cleanly(tmp_path: Path) -> None:
    cfg = tmp_path / "namesrv.toml"
    cfg.write_text('[namesrv]\nbroker_expiry = 999.0\nscan_interval = 0.2\nlog_level = "INFO"\n')
    with SluiceProcess.start(["namesrv", "--config", str(cfg), "--broker-expiry", "0.5"], tmp_path, name="cfg") as ns:
        ns.wait_for_stderr("broker expiry 0.5s")
        with SyncRemotingClient() as client:  # a live connection does not hold up a graceful stop
            assert client.invoke(ns.addr, route_request("X"), 5).code == ResponseCode.TOPIC_NOT_EXIST
            ns.signal(signal.SIGTERM)
            assert ns.proc.wait(10) == 0
            with pytest.raises(RemotingError):
                client.invoke(ns.addr, route_request("X"), 2)
        assert "namesrv stopping" in ns.stderr()
    bad = tmp_path / "bad.toml"
    bad.write_text("brokr_expiry = 1\n")
    with pytest.raises(RuntimeError, match="unknown setting 'brokr_expiry'"):
        SluiceProcess.start(["namesrv", "--config", str(bad)], tmp_path, name="bad", ready_timeout=10)
