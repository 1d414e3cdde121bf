"""Two brokers, each with its own filter server: the class is registered with both, each queue is pulled
from its own broker's filter server, and the consumers get exactly the class's messages of both brokers."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sdk_class_support import (config, pull_numbers, running_cluster, send_numbered, wait_for,
                               wait_for_filter_servers, write_repository)

from sluice import AsyncPullConsumer, MessageSelector
from sluice.client.class_filter import ClassFilters
from sluice.namesrv.client import SyncNamesrvClient

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def test_each_brokers_queues_come_through_its_own_filter_server(tmp_path: Path):
    repo = write_repository(tmp_path)
    with running_cluster(tmp_path, ("broker-a", "broker-b"), config=config(repo)) as c:
        wait_for_filter_servers(c.ns, 2)
        send_numbered(c.ns, "Two", 0, 80)
        with SyncNamesrvClient(c.ns) as nsc:
            wait_for(lambda: len(nsc.get_route("Two").broker_datas) == 2, 20, "the topic on both brokers")
            table = nsc.get_route("Two").filter_server_table
        assert set(table) == {c.brokers[0].addr, c.brokers[1].addr} and all(len(v) == 1 for v in table.values())

        async def main() -> tuple[list[int], set[str]]:
            got = await pull_numbers(c.ns, "two_g", "Two", MessageSelector.by_class("thirds:Third"))
            async with AsyncPullConsumer("two_h", namesrv=c.ns) as pc:
                sel = MessageSelector.by_class("evens:Even")
                for mq in await pc.fetch_message_queues("Two"):
                    await pc.pull(mq, sel, 0)
                registered = {fs for (fs, g, t) in ClassFilters.of(pc.instance).registered if g == "two_h"}
            return got, registered
        got, registered = asyncio.run(main())
        assert sorted(got) == [i for i in range(80) if i % 3 == 0]
        assert registered == {a for v in table.values() for a in v}  # every filter server got the class
