"""NamesrvServer in-process (real loopback sockets, no subprocess): the less common requests."""
from __future__ import annotations

import asyncio

from sluice.namesrv.client import NamesrvClient
from sluice.namesrv.server import NamesrvConfig, NamesrvServer
from sluice.protocol.bodies import DataVersion, TopicConfig, decode_body, encode_body
from sluice.transport.client import RemotingClient
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import QueryDataVersionRequestHeader, QueryDataVersionResponseHeader

BROKER = {"brokerName": "b1", "brokerAddr": "127.0.0.1:10911", "clusterName": "C", "brokerId": "0"}


def run(coro_fn, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro_fn()
    asyncio.run(bounded())


def test_query_data_version_compressed_refusal_and_kv() -> None:
    async def main() -> None:
        ns = NamesrvServer(NamesrvConfig(listen="127.0.0.1:0"))
        await ns.start()
        remoting = RemotingClient()
        client = NamesrvClient([ns.address], remoting)
        try:
            version = DataVersion(timestamp=5, counter=7)
            [outcome] = await client.register_broker(cluster_name="C", broker_name="b1", broker_addr="127.0.0.1:10911",
                                                     topics=[TopicConfig(topic_name="T")], data_version=version)
            assert outcome.ok

            async def query(v: DataVersion) -> tuple[bool, DataVersion]:
                header = QueryDataVersionRequestHeader.from_ext(BROKER)
                resp = await remoting.invoke(ns.address, RemotingCommand.request(
                    RequestCode.QUERY_DATA_VERSION, header.to_ext(), encode_body(v)), 5)
                return QueryDataVersionResponseHeader.from_command(resp).changed, decode_body(DataVersion, resp.body)
            assert await query(version) == (False, version)
            assert await query(DataVersion(timestamp=5, counter=8)) == (True, version)

            compressed = RemotingCommand.request(RequestCode.REGISTER_BROKER, {**BROKER, "compressed": "true"}, b"\x78\x9c")
            resp = await remoting.invoke(ns.address, compressed, 5)
            assert resp.code == ResponseCode.INVALID_PARAMETER and "compressed" in (resp.remark or "")

            resp = await remoting.invoke(ns.address, RemotingCommand.request(
                RequestCode.GET_KV_CONFIG, {"namespace": "N", "key": "k"}), 5)
            assert resp.code == ResponseCode.QUERY_NOT_FOUND and "N" in (resp.remark or "")
            assert (await client.get_route("T")).queue_datas[0].read_queue_nums == 16
        finally:
            await client.close()
            await remoting.close()
            await ns.close()
    run(main)


def test_kv_config_is_capped_in_count_and_size() -> None:
    async def main() -> None:
        ns = NamesrvServer(NamesrvConfig(listen="127.0.0.1:0", kv_max_entries=3, kv_max_key_bytes=8,
                                         kv_max_value_bytes=16))
        await ns.start()
        remoting = RemotingClient()

        async def put(namespace: str, key: str, value: str) -> RemotingCommand:
            return await remoting.invoke(ns.address, RemotingCommand.request(
                RequestCode.PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value}), 5)
        try:
            for key in ("a", "b"):
                assert (await put("N", key, "v")).code == ResponseCode.SUCCESS
            assert (await put("M", "c", "v" * 16)).code == ResponseCode.SUCCESS  # at the caps: stored
            # Size caps, each naming its setting; nothing is stored.
            for args, remark in (((("N" * 9), "k", "v"), "namespace of 9 bytes exceeds the namesrv's limit of 8 bytes "
                                  "(kv_max_key_bytes)"),
                                 (("N", "é" * 5, "v"), "key of 10 bytes exceeds the namesrv's limit of 8 bytes"),
                                 (("N", "a", "v" * 17), "value of 17 bytes exceeds the namesrv's limit of 16 bytes "
                                  "(kv_max_value_bytes)")):
                resp = await put(*args)
                assert resp.code == ResponseCode.INVALID_PARAMETER and remark in (resp.remark or ""), resp.remark
            assert ns.routes.get_kv("N", "a") == "v"
            # The count cap: a new entry is refused, replacing one is not.
            resp = await put("N", "d", "v")
            assert resp.code == ResponseCode.INVALID_PARAMETER
            assert "KV config is full: 3 entries is the namesrv's limit (kv_max_entries)" in (resp.remark or "")
            assert ns.routes.get_kv("N", "d") is None
            assert (await put("N", "a", "w")).code == ResponseCode.SUCCESS
            assert ns.routes.get_kv("N", "a") == "w"
            resp = await remoting.invoke(ns.address, RemotingCommand.request(
                RequestCode.DELETE_KV_CONFIG, {"namespace": "N", "key": "b"}), 5)
            assert resp.code == ResponseCode.SUCCESS
            assert (await put("N", "d", "v")).code == ResponseCode.SUCCESS  # room again
        finally:
            await remoting.close()
            await ns.close()
    run(main)


def test_namesrv_connection_bounds_come_from_its_config() -> None:
    async def main() -> None:
        ns = NamesrvServer(NamesrvConfig(listen="127.0.0.1:0", idle_timeout=0.3, max_connections=2,
                                         frame_budget=1 << 20))
        assert (ns.server.idle_timeout, ns.server.max_connections, ns.server.budget.limit) == (0.3, 2, 1 << 20)
        await ns.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", ns.server.port)
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed for idleness
            writer.close()
            assert ns.server.idle_closed == 1
        finally:
            await ns.close()
    run(main)


def test_namesrv_toml_reads_the_bounds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice.namesrv.cli import load_config_file

    path = tmp_path / "ns.toml"
    path.write_text("[namesrv]\nframe_budget = 1048576\nmax_connections = 10\nidle_timeout = 30\n"
                    "kv_max_entries = 5\nkv_max_key_bytes = 64\nkv_max_value_bytes = 1024\n")
    settings = load_config_file(path)
    config = NamesrvConfig(**settings)
    assert (config.frame_budget, config.max_connections, config.idle_timeout) == (1 << 20, 10, 30.0)
    assert (config.kv_max_entries, config.kv_max_key_bytes, config.kv_max_value_bytes) == (5, 64, 1024)


def test_a_server_that_is_not_a_namesrv_is_named_as_such() -> None:
    # A broker's address given as the namesrv's: the broker answers REQUEST_CODE_NOT_SUPPORTED, which used to reach
    # the user as "request code 105 not supported". Queries and registrations now say what is likely wrong.
    from sluice.errors import RequestCodeNotSupportedError
    from sluice.transport.server import RemotingServer

    async def main() -> None:
        other = RemotingServer("127.0.0.1", 0)  # serves no namesrv request, as a broker does not
        await other.start()
        client = NamesrvClient(other.address)
        try:
            try:
                await client.get_route("Orders")
            except RequestCodeNotSupportedError as exc:
                msg = str(exc)
            else:
                raise AssertionError("no error")
            assert other.address in msg and "GET_ROUTEINFO_BY_TOPIC (105)" in msg and "is it a namesrv?" in msg
            outcomes = await client.register_broker(cluster_name="C", broker_name="b", broker_addr="127.0.0.1:1")
            assert len(outcomes) == 1 and isinstance(outcomes[0].error, RequestCodeNotSupportedError)
            assert "REGISTER_BROKER (103)" in str(outcomes[0].error) and "is it a namesrv?" in str(outcomes[0].error)
        finally:
            await client.close()
            await other.close()
    run(main)
