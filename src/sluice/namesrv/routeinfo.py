"""The namesrv's route table (RouteInfoManager.java, 4.x semantics). Pure: no I/O, time passed in.

Tables:
  topic -> {brokerName -> QueueData}      queues and permissions of each topic per broker
  brokerName -> BrokerData                cluster and {brokerId -> addr} (0 is the master)
  cluster -> {brokerName}
  brokerAddr -> BrokerLive                last registration time, data version, HA address, connection key
  brokerAddr -> [filter server addr]

Only a master's registration (brokerId 0) updates topic queue data, and only
when its data version changed or it is new; an unchanged registration still
restores the broker's topics missing here (a route deleted at the namesrv
comes back with the broker's next periodic registration). Topics are removed when their
last broker goes away (unregister, expiry, connection loss) or on delete.
The server runs everything on one event loop, so no locking is needed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sluice.protocol.bodies import (
    MASTER_ID, PERM_WRITE, BrokerData, ClusterInfo, DataVersion, QueueData, TopicConfig, TopicConfigSerializeWrapper,
    TopicList, TopicRouteData,
)

__all__ = ["BrokerLive", "RegisterResult", "RouteInfoManager"]

NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


@dataclass(slots=True)
class BrokerLive:
    last_update: float
    data_version: DataVersion
    ha_server_addr: str
    conn_key: Any = None


@dataclass(frozen=True, slots=True)
class RegisterResult:
    ha_server_addr: str | None = None
    master_addr: str | None = None


class RouteInfoManager:
    def __init__(self) -> None:
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLive] = {}
        self.filter_server_table: dict[str, list[str]] = {}
        self.kv_config: dict[str, dict[str, str]] = {}

    # ------------------------------------------------------------------------------ registration

    def register_broker(
        self, *, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int, ha_server_addr: str,
        topic_config_wrapper: TopicConfigSerializeWrapper | None, filter_server_list: list[str], now: float,
        conn_key: Any = None,
    ) -> RegisterResult:
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        broker_data = self.broker_addr_table.get(broker_name)
        register_first = broker_data is None
        if broker_data is None:
            broker_data = BrokerData(cluster=cluster_name, broker_name=broker_name, broker_addrs={})
            self.broker_addr_table[broker_name] = broker_data
        addrs = broker_data.broker_addrs
        # The same address under another id (a slave promoted to master): drop the old entry.
        for bid in [bid for bid, a in addrs.items() if a == broker_addr and bid != broker_id]:
            del addrs[bid]
        old_addr = addrs.get(broker_id)
        addrs[broker_id] = broker_addr
        register_first = register_first or old_addr is None

        if topic_config_wrapper is not None and broker_id == MASTER_ID:
            table = topic_config_wrapper.topic_config_table
            if register_first or self._topic_config_changed(broker_addr, topic_config_wrapper.data_version):
                for topic, config in table.items():
                    self._create_and_update_queue_data(broker_name, config.topic_name or topic, config)
            else:
                # Unchanged version: still bring back routes deleted here (DELETE_TOPIC_IN_NAMESRV), as Java's
                # forced registration every 30 s is meant to (BrokerController.registerBrokerAll(true, false,
                # forceRegister)); queues present stay as they are (WIPE_WRITE_PERM_OF_BROKER holds).
                queue_table = self.topic_queue_table
                for topic, config in table.items():
                    name = config.topic_name or topic
                    if broker_name not in queue_table.get(name, ()):
                        self._create_and_update_queue_data(broker_name, name, config)

        data_version = topic_config_wrapper.data_version if topic_config_wrapper is not None else DataVersion()
        self.broker_live_table[broker_addr] = BrokerLive(now, data_version, ha_server_addr, conn_key)
        if filter_server_list:
            self.filter_server_table[broker_addr] = list(filter_server_list)
        else:
            self.filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    return RegisterResult(ha_server_addr=master_live.ha_server_addr, master_addr=master_addr)
        return RegisterResult()

    def _topic_config_changed(self, broker_addr: str, version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != version

    def _create_and_update_queue_data(self, broker_name: str, topic: str, config: TopicConfig) -> None:
        queue = QueueData(
            broker_name=broker_name, read_queue_nums=config.read_queue_nums,
            write_queue_nums=config.write_queue_nums, perm=config.perm, topic_syn_flag=config.topic_sys_flag,
        )
        self.topic_queue_table.setdefault(topic, {})[broker_name] = queue

    def change_write_perm(self, broker_name: str, *, writable: bool) -> int:
        """Take write permission from (or give it back to) every topic of ``broker_name`` in this namesrv's
        routes (RouteInfoManager.wipeWritePermOfBroker / addWritePermOfBroker); the number of topics changed.
        The broker's next registration keeps it unless its topic table changed (see register_broker)."""
        changed = 0
        for queues in self.topic_queue_table.values():
            q = queues.get(broker_name)
            if q is None:
                continue
            perm = (q.perm | PERM_WRITE) if writable else (q.perm & ~PERM_WRITE)
            if perm != q.perm:
                queues[broker_name] = dataclasses.replace(q, perm=perm)
            changed += 1
        return changed

    def is_topic_config_changed(self, broker_addr: str, version: DataVersion) -> bool:
        """QUERY_DATA_VERSION: does the broker's version differ from what we hold?"""
        return self._topic_config_changed(broker_addr, version)

    def data_version_of(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return live.data_version if live else None

    def touch(self, broker_addr: str, now: float) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update = now

    def unregister_broker(self, *, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        remove_name = False
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is not None:
            if broker_data.broker_addrs.get(broker_id) == broker_addr:
                del broker_data.broker_addrs[broker_id]
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                remove_name = True
        if remove_name:
            names = self.cluster_addr_table.get(cluster_name)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster_name]
            self._remove_topics_of_broker(broker_name)

    def _remove_topics_of_broker(self, broker_name: str) -> None:
        for topic in list(self.topic_queue_table):
            queues = self.topic_queue_table[topic]
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queue_table[topic]

    def remove_broker_by_addr(self, broker_addr: str) -> bool:
        """Forget a broker known only by address (expiry, connection loss); RouteInfoManager.onChannelDestroy."""
        for broker_name, data in list(self.broker_addr_table.items()):
            for broker_id, addr in list(data.broker_addrs.items()):
                if addr == broker_addr:
                    self.unregister_broker(cluster_name=data.cluster, broker_addr=addr,
                                           broker_name=broker_name, broker_id=broker_id)
                    return True
        found = broker_addr in self.broker_live_table
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        return found

    def remove_brokers_of_connection(self, conn_key: Any) -> list[str]:
        """The connection a broker registered on closed: forget that broker (BrokerHousekeepingService)."""
        addrs = [a for a, live in self.broker_live_table.items() if live.conn_key is not None and live.conn_key is conn_key]
        for addr in addrs:
            self.remove_broker_by_addr(addr)
        return addrs

    def scan_not_active_brokers(self, now: float, expiry: float) -> list[str]:
        """Remove brokers silent for longer than ``expiry`` seconds; returns their addresses."""
        expired = [addr for addr, live in self.broker_live_table.items() if live.last_update + expiry < now]
        for addr in expired:
            self.remove_broker_by_addr(addr)
        return expired

    # ---------------------------------------------------------------------------------- queries

    def pick_topic_route_data(self, topic: str) -> TopicRouteData | None:
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        broker_datas = []
        filter_table: dict[str, list[str]] = {}
        for broker_name in queues:
            data = self.broker_addr_table.get(broker_name)
            if data is None:
                continue
            broker_datas.append(BrokerData(cluster=data.cluster, broker_name=data.broker_name,
                                           broker_addrs=dict(sorted(data.broker_addrs.items()))))
            for addr in data.broker_addrs.values():
                servers = self.filter_server_table.get(addr)
                if servers:
                    filter_table[addr] = list(servers)
        if not broker_datas:
            return None
        return TopicRouteData(
            order_topic_conf=self.get_kv(NAMESPACE_ORDER_TOPIC_CONFIG, topic),
            queue_datas=sorted(queues.values(), key=lambda q: q.broker_name),
            broker_datas=broker_datas,
            filter_server_table=filter_table,
        )

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={name: BrokerData(cluster=d.cluster, broker_name=d.broker_name,
                                                broker_addrs=dict(sorted(d.broker_addrs.items())))
                               for name, d in self.broker_addr_table.items()},
            cluster_addr_table={c: sorted(names) for c, names in self.cluster_addr_table.items()},
        )

    def all_topics(self) -> TopicList:
        return TopicList(topic_list=sorted(self.topic_queue_table))

    def delete_topic(self, topic: str) -> bool:
        return self.topic_queue_table.pop(topic, None) is not None

    # ---------------------------------------------------------------------------------- kv config

    def put_kv(self, namespace: str, key: str, value: str) -> None:
        self.kv_config.setdefault(namespace, {})[key] = value

    def get_kv(self, namespace: str, key: str) -> str | None:
        return self.kv_config.get(namespace, {}).get(key)

    def delete_kv(self, namespace: str, key: str) -> None:
        table = self.kv_config.get(namespace)
        if table is not None:
            table.pop(key, None)
            if not table:
                del self.kv_config[namespace]
