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
