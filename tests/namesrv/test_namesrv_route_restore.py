"""A route deleted at a real namesrv comes back with the real broker's next periodic registration (RocketMQ's
BrokerController.registerBrokerAll(true, false, forceRegister) every registerNameServerPeriod)."""
from __future__ import annotations

from pathlib import Path

import pytest
from servers import running_cluster, wait_for, wait_for_route

from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient

pytestmark = pytest.mark.integration


def _routed(ns: SyncNamesrvClient, topic: str) -> bool:
    try:
        return bool(ns.get_route(topic).broker_datas)
    except SluiceError:
        return False


def test_deleted_and_unregistered_routes_come_back(tmp_path: Path) -> None:
    with running_cluster(tmp_path, config="register_namesrv_period_ms = 300\n") as c:
        with SyncNamesrvClient(c.ns) as ns:
            ns.delete_topic("TBW102")
            wait_for_route(c.ns, "TBW102", timeout=10.0)
            # The namesrv forgets the whole broker; its next registration brings it and its topics back.
            assert all(o.ok for o in ns.unregister_broker(cluster_name="DefaultCluster", broker_name="broker-a",
                                                          broker_addr=c.broker.addr))
            wait_for(lambda: _routed(ns, "TBW102") and ns.get_cluster_info().broker_addr_table,
                     10.0, "the broker registered again")
