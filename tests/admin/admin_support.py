"""Helpers for the admin tests: run ``sluice admin`` in-process, real namesrv/broker subprocesses, dead letters.

A uniquely named module (never conftest.py, whose name other test folders share): test modules
import what they need from here, fixtures included.
"""
from __future__ import annotations

import io
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import servers
from servers import running_cluster, wait_for, wait_for_route  # noqa: F401 (re-exported to the tests)

from sluice.admin import ExitStatus, main
from sluice.protocol import properties as P
from sluice.protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from sluice.transport.client import RemotingClient
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import ConsumerSendMsgBackRequestHeader, SendMessageRequestHeader
from sluice.protocol.msgid import new_unique_id
from sluice.transport.blocking import SyncRemotingClient


@dataclass
class Run:
    """One in-process ``sluice admin`` run: its exit status and what it wrote."""

    status: ExitStatus
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.stdout)

    @property
    def error(self) -> dict[str, Any]:
        return orjson.loads(self.stderr)["error"]


def run_admin(*argv: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> Run:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), env or {}, stdout=out, stderr=err, stdin=io.BytesIO(stdin))
    return Run(status, out.getvalue(), err.getvalue())


class Cluster(servers.Cluster):
    def admin(self, *argv: str) -> Run:
        """``sluice admin ARGV -n <this namesrv>``."""
        return run_admin(*argv, "-n", self.ns)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One namesrv and two brokers (broker-a, broker-b) of DefaultCluster, shared by a module's tests."""
    with running_cluster(tmp_path_factory.mktemp("admin"), ("broker-a", "broker-b"), "--cluster-name",
                         "DefaultCluster", cls=Cluster) as c:
        yield c  # type: ignore[misc]


_names = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return f"A{next(_names)}_{request.node.name[:40].replace('[', '_').replace(']', '_').replace('-', '_')}"


def write_dead_letter(broker_addr: str, group: str, body: bytes, *, origin: str | None, tags: str | None = None,
                      keys: str | None = None, props: dict[str, str] | None = None, via_retry: bool = True,
                      reconsume_times: int = 17) -> str:
    """Store a dead letter of ``group`` the way a broker does; returns its msgId (UNIQ_KEY).

    ``via_retry``: a send to %RETRY%<group> past maxReconsumeTimes, which the broker moves to %DLQ%<group>
    (the client's send-back fallback; the origin is in RETRY_TOPIC). Otherwise straight to %DLQ%<group>
    with DLQ_ORIGIN_TOPIC, as the retry service stores one.
    """
    uid = new_unique_id()
    all_props = {P.UNIQ_KEY: uid, **(props or {})}
    if tags:
        all_props[P.TAGS] = tags
    if keys:
        all_props[P.KEYS] = keys
    if origin is not None:
        all_props[P.RETRY_TOPIC if via_retry else P.DLQ_ORIGIN_TOPIC] = origin
        all_props[P.ORIGIN_MESSAGE_ID] = uid
    all_props[P.RECONSUME_TIME] = str(reconsume_times)
    header = SendMessageRequestHeader(
        producer_group="dlq-writer", topic=(f"%RETRY%{group}" if via_retry else f"%DLQ%{group}"),
        default_topic="TBW102", default_topic_queue_nums=1, queue_id=0, sys_flag=0,
        born_timestamp=int(time.time() * 1000), flag=0, properties=P.encode_properties(all_props),
        reconsume_times=reconsume_times, max_reconsume_times=16)
    with SyncRemotingClient() as client:
        client.invoke(broker_addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, header.to_ext(), body),
                      5.0).raise_for_code()
    return uid


async def join_group(client: RemotingClient, addrs: list[str], group: str, topic: str, client_id: str,
                     expression: str = "*") -> None:
    """Heartbeat ``client_id`` into ``group`` (subscribed to ``topic``) on each broker; the membership
    lasts while ``client``'s connections stay open."""
    tags = [] if expression == "*" else [t.strip() for t in expression.split("||")]
    hb = HeartbeatData(client_id=client_id, consumer_data_set=[ConsumerData(
        group_name=group, consume_type="CONSUME_PASSIVELY",
        subscription_data_set=[SubscriptionData(topic=topic, sub_string=expression, tags_set=tags)])])
    for addr in addrs:
        (await client.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(hb)), 5.0)
         ).raise_for_code()


def send_back_to_dlq(broker_addr: str, group: str, commitlog_offset: int, origin_topic: str, msg_id: str) -> bool:
    """CONSUMER_SEND_MSG_BACK with a negative delay level: the broker's retry service moves the stored
    message to %DLQ%<group> at once. False when the broker does not serve the request."""
    header = ConsumerSendMsgBackRequestHeader(offset=commitlog_offset, group=group, delay_level=-1,
                                              origin_msg_id=msg_id, origin_topic=origin_topic)
    with SyncRemotingClient() as client:
        resp = client.invoke(broker_addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK,
                                                                  header.to_ext()), 5.0)
    if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
        return False
    resp.raise_for_code()
    return True
