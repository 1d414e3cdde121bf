"""Filter servers in a TLS cluster: a broker in tls_mode enforcing with filter_server_nums = 1 starts its
child with its own TLS settings, the child registers with the broker over TLS (its certificate pinned) and
serves consumers only over TLS; the SDK with tls=True registers the class (302) and pulls through it, push and
pull consumers getting exactly the class's messages. With mutual TLS (tls_client_ca) the child presents the
broker's certificate to the broker and requires one of consumers."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sdk_class_support import config, write_repository
from servers import Cluster, running_cluster, wait_for, wait_for_route
from tls_certs import Certs

from sluice import AsyncPullConsumer, ConsumeResult, Message, MessageSelector, Producer, PullStatus, PushConsumer
from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import SyncRemotingClient
from sluice.transport.tls import ClientTls

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

N = 40


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def tls_class_cluster(tmp: Path, certs: Certs, *broker_extra: str) -> Iterator[Cluster]:
    repo = write_repository(tmp)
    with running_cluster(tmp, ("broker-a",), *certs.server_args("enforcing"), "--namesrv-tls", "--namesrv-tls-ca",
                         certs.ca_file, *broker_extra, config=config(repo),
                         namesrv_extra=certs.server_args("enforcing"), client_tls=certs.client()) as c:
        yield c


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Cluster]:
    yield from tls_class_cluster(tmp_path_factory.mktemp("enforcing"), certs)


def filter_servers(c: Cluster, topic: str) -> list[str]:
    """The filter servers the namesrv routes ``topic`` with, once it has one (asked over TLS)."""
    def ready() -> list[str] | None:
        with SyncNamesrvClient(c.ns, tls=c.tls) as ns:
            try:
                table = ns.get_route(topic).filter_server_table
            except SluiceError:
                return None
        return sorted(a for addrs in table.values() for a in addrs) or None
    return wait_for(ready, 60.0, f"a filter server in the route of {topic}", interval=0.2)


def send_numbered(c: Cluster, topic: str, sdk: dict[str, object]) -> None:
    with Producer(f"p_{topic}", namesrv=c.ns, **sdk) as p:  # type: ignore[arg-type]
        for i in range(N):
            p.send(Message(topic, f"m{i}".encode(), properties={"n": str(i)}))
    wait_for_route(c.ns, topic, tls=c.tls)


async def pull_numbers(c: Cluster, group: str, topic: str, sel: MessageSelector, sdk: dict[str, object]) -> list[int]:
    async with AsyncPullConsumer(group, namesrv=c.ns, pull_timeout=30.0, **sdk) as consumer:  # type: ignore[arg-type]
        out: list[int] = []
        for mq in await consumer.fetch_message_queues(topic):
            end, off = await consumer.max_offset(mq), 0
            deadline = time.monotonic() + 60
            while off < end and time.monotonic() < deadline:
                r = await consumer.pull(mq, sel, off, 32)
                if r.status is PullStatus.FOUND:
                    out += [int(m.properties["n"]) for m in r.msg_found_list]
                elif r.status is PullStatus.NO_NEW_MSG:
                    break
                off = r.next_begin_offset
        return out


def sdk_tls(certs: Certs, **more: object) -> dict[str, object]:
    return {"tls": True, "tls_ca": certs.ca_file, **more}


def test_pull_consumer_over_tls_gets_exactly_the_classes_messages(enforcing: Cluster, certs: Certs) -> None:
    topic = "TlsClassPull"
    send_numbered(enforcing, topic, sdk_tls(certs))
    assert filter_servers(enforcing, topic)
    got = asyncio.run(pull_numbers(enforcing, "tls_even", topic, MessageSelector.by_class("evens:Even"),
                                   sdk_tls(certs)))
    assert sorted(got) == [i for i in range(N) if i % 2 == 0]


def test_push_consumer_over_tls_gets_exactly_the_classes_messages(enforcing: Cluster, certs: Certs) -> None:
    topic = "TlsClassPush"
    send_numbered(enforcing, topic, sdk_tls(certs))
    assert filter_servers(enforcing, topic)
    got: list[int] = []
    lock = threading.Lock()

    def listener(msgs) -> ConsumeResult:  # type: ignore[no-untyped-def]
        with lock:
            got.extend(int(m.properties["n"]) for m in msgs)
        return ConsumeResult.SUCCESS
    want = [i for i in range(N) if i % 2 == 1]
    c = PushConsumer("tls_odd", namesrv=enforcing.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     **sdk_tls(certs))  # type: ignore[arg-type]
    c.subscribe(topic, MessageSelector.by_class("odds:Odd"))
    c.register_listener(listener)
    c.start()
    try:
        wait_for(lambda: len(got) >= len(want), 60, "the odd messages at the listener")
        time.sleep(0.5)  # anything beyond the class's set would arrive now
    finally:
        c.shutdown()
    assert sorted(got) == want


def test_the_filter_servers_port_refuses_plain_tcp(enforcing: Cluster, certs: Certs) -> None:
    (fs,) = filter_servers(enforcing, "TBW102")
    with SyncRemotingClient() as plain:
        with pytest.raises((SluiceError, OSError)):
            plain.invoke(fs, RemotingCommand.request(RequestCode.PULL_MESSAGE, {}), timeout=5.0)
    with SyncRemotingClient(tls=certs.client()) as tls:  # over TLS the same request reaches the handler
        resp = tls.invoke(fs, RemotingCommand.request(RequestCode.PULL_MESSAGE, {}), timeout=5.0)
        assert resp.code != 0 and resp.remark


def test_mutual_tls_child_presents_the_brokers_certificate(tmp_path: Path, certs: Certs) -> None:
    """tls_client_ca: the broker and its filter server require client certificates; the child gets through
    with the broker's own, a consumer with one of its own, and a consumer without one is refused."""
    cert, key = certs.client_files("consumer-1")
    cluster = tls_class_cluster(tmp_path, certs, "--tls-client-ca", certs.ca_file)
    c = next(cluster)
    try:
        mutual = sdk_tls(certs, tls_cert=cert, tls_key=key)
        topic = "TlsClassMutual"
        send_numbered(c, topic, mutual)
        (fs,) = filter_servers(c, topic)  # registered over mutual TLS (301 from the child)
        got = asyncio.run(pull_numbers(c, "mtls_third", topic, MessageSelector.by_class("thirds:Third"), mutual))
        assert sorted(got) == [i for i in range(N) if i % 3 == 0]
        with SyncRemotingClient(tls=ClientTls(ca=certs.ca_file)) as no_cert:
            with pytest.raises((SluiceError, OSError)):
                no_cert.invoke(fs, RemotingCommand.request(RequestCode.PULL_MESSAGE, {}), timeout=5.0)
    finally:
        cluster.close()


def test_children_get_the_brokers_tls_settings(tmp_path: Path) -> None:
    from sluice.broker.filter_servers import tls_args
    assert tls_args("disabled", "", "", "") == []
    args = tls_args("permissive", "c.pem", "k.pem", "")
    cert, key = str(Path("c.pem").absolute()), str(Path("k.pem").absolute())
    assert args == ["--tls-mode", "permissive", "--tls-cert", cert, "--tls-key", key,
                    "--broker-tls", "--broker-tls-ca", cert, "--broker-tls-pin"]
    mutual = tls_args("enforcing", "c.pem", "k.pem", "ca.pem")
    assert mutual[-6:] == ["--tls-client-ca", str(Path("ca.pem").absolute()), "--broker-tls-cert", cert,
                           "--broker-tls-key", key]


def test_filtersrv_refuses_broker_tls_options_without_broker_tls() -> None:
    from click.testing import CliRunner

    from sluice.filtersrv.cli import filtersrv_command
    result = CliRunner().invoke(filtersrv_command, ["--broker", "127.0.0.1:1", "--broker-tls-ca", "x.pem"])
    assert result.exit_code == 2 and "need --broker-tls" in result.output
    with pytest.raises(SluiceError, match="pinned"):
        ClientTls(pinned=True).context()
