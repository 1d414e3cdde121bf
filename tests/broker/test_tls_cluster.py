"""TLS end to end: real ``sluice namesrv`` / ``sluice broker`` subprocesses with ``--tls-mode``, the broker
registering over TLS, the SDK sending and consuming with ``tls=True, tls_ca=...``, ``sluice admin --tls-ca``."""
from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import Cluster, running_cluster, wait_for, wait_for_route
from tls_certs import Certs

from sluice import ConsumeResult, Message, Producer, PullConsumer, PushConsumer
from sluice.admin import ExitStatus, main
from sluice.errors import SluiceError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def tls_cluster(tmp: Path, certs: Certs, mode: str) -> Iterator[Cluster]:
    """Namesrv and broker both in ``mode``; the broker registers over TLS, checking the namesrv's certificate."""
    with running_cluster(tmp, ("broker-a",), *certs.server_args(mode), "--namesrv-tls", "--namesrv-tls-ca",
                         certs.ca_file, namesrv_extra=certs.server_args(mode), client_tls=certs.client()) as c:
        yield c


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Cluster]:
    yield from tls_cluster(tmp_path_factory.mktemp("enforcing"), certs, "enforcing")


@pytest.fixture(scope="module")
def permissive(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Cluster]:
    yield from tls_cluster(tmp_path_factory.mktemp("permissive"), certs, "permissive")


def send_and_pull(ns: str, topic: str, bodies: list[bytes], producer_opts: dict[str, object],
                  consumer_opts: dict[str, object], tls_route: object = None) -> list[bytes]:
    """Send ``bodies`` to ``topic``, then pull every queue from 0: the bodies found."""
    with Producer(f"PG_{topic}", ns, **producer_opts) as p:  # type: ignore[arg-type]
        for body in bodies:
            p.send(Message(topic, body))
    wait_for_route(ns, topic, tls=tls_route)  # type: ignore[arg-type]
    got: list[bytes] = []
    with PullConsumer(f"CG_{topic}", ns, **consumer_opts) as c:  # type: ignore[arg-type]
        for mq in c.fetch_message_queues(topic):
            offset = 0
            for _ in range(100):  # bounded: a few pulls per queue suffice
                result = c.pull(mq, "*", offset, max_nums=32)
                if not result.msg_found_list:
                    break
                got += [m.body for m in result.msg_found_list]
                offset = result.next_begin_offset
    return got


def test_enforcing_cluster_serves_the_sdk_over_tls(enforcing: Cluster, certs: Certs) -> None:
    bodies = [b"secret-%d" % i for i in range(20)]
    tls = {"tls": True, "tls_ca": certs.ca_file}
    got = send_and_pull(enforcing.ns, "TopicTlsEnforcing", bodies, tls, tls, tls_route=certs.client())
    assert sorted(got) == sorted(bodies)


def test_enforcing_cluster_refuses_plain_clients_and_logs_it(enforcing: Cluster, certs: Certs) -> None:
    with Producer("PG_plain_refused", enforcing.ns, retry_times=0, send_timeout=5) as p:
        with pytest.raises(SluiceError):
            p.send(Message("TopicTlsEnforcing", b"in the clear"))
    enforcing.namesrv.wait_for_stderr("refusing plain (non-TLS) connection")
    # A plain client aimed straight at the broker is refused there too.
    from sluice.transport.blocking import SyncRemotingClient
    from sluice.protocol.command import RemotingCommand
    from sluice.protocol.codes import RequestCode
    client = SyncRemotingClient()
    try:
        with pytest.raises(SluiceError):
            client.invoke(enforcing.broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5)
    finally:
        client.close()
    enforcing.broker.wait_for_stderr("refusing plain (non-TLS) connection")


def test_a_client_that_cannot_check_the_certificate_is_refused(enforcing: Cluster, tmp_path: Path) -> None:
    other = Certs(tmp_path)  # another CA: the cluster's certificate is not its
    with Producer("PG_wrong_ca", enforcing.ns, tls=True, tls_ca=other.ca_file, retry_times=0, send_timeout=5) as p:
        with pytest.raises(SluiceError, match="CERTIFICATE_VERIFY_FAILED"):
            p.send(Message("TopicTlsEnforcing", b"x"))


def test_a_push_consumer_consumes_over_tls(enforcing: Cluster, certs: Certs) -> None:
    got: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs: list) -> ConsumeResult:  # type: ignore[type-arg]
        with lock:
            got.extend(m.body for m in msgs)
        return ConsumeResult.SUCCESS

    with Producer("PG_tls_push", enforcing.ns, tls=True, tls_ca=certs.ca_file) as p:
        p.send(Message("TopicTlsPush", b"pushed over tls"))
    wait_for_route(enforcing.ns, "TopicTlsPush", tls=certs.client())
    cons = PushConsumer("CG_tls_push", namesrv=enforcing.ns, tls=True, tls_ca=certs.ca_file,
                        consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    cons.subscribe("TopicTlsPush", "*")
    cons.register_listener(listener)
    cons.start()
    try:
        wait_for(lambda: b"pushed over tls" in got, 20, "a message pushed over TLS")
    finally:
        cons.shutdown()


def admin(*argv: str, env: dict[str, str] | None = None) -> tuple[ExitStatus, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), env or {}, stdout=out, stderr=err, stdin=io.BytesIO(b""))
    return status, out.getvalue(), err.getvalue()


def test_admin_over_tls_by_flag_and_by_environment(enforcing: Cluster, certs: Certs) -> None:
    status, out, err = admin("clusterList", "-n", enforcing.ns, "--tls-ca", certs.ca_file)
    assert status == ExitStatus.SUCCESS, err
    assert "broker-a" in out
    status, out, err = admin("brokerStatus", "-n", enforcing.ns, "-b", enforcing.broker.addr,
                             env={"SLUICE_TLS": "1", "SLUICE_TLS_CA": certs.ca_file})
    assert status == ExitStatus.SUCCESS, err
    status, _, err = admin("clusterList", "-n", enforcing.ns, "--timeout", "3")  # plain: refused
    assert status != ExitStatus.SUCCESS


def test_permissive_cluster_serves_tls_and_plain_clients_together(permissive: Cluster, certs: Certs) -> None:
    tls = {"tls": True, "tls_ca": certs.ca_file}
    # A TLS producer and a plain consumer, then the other way round, on the same ports.
    got = send_and_pull(permissive.ns, "TopicPermissiveA", [b"a1", b"a2"], tls, {})
    assert sorted(got) == [b"a1", b"a2"]
    got = send_and_pull(permissive.ns, "TopicPermissiveB", [b"b1", b"b2"], {}, tls, tls_route=certs.client())
    assert sorted(got) == [b"b1", b"b2"]
    assert "refusing plain" not in permissive.broker.stderr()


def test_a_broker_with_unusable_tls_files_does_not_start(tmp_path: Path, certs: Certs) -> None:
    argv = [sys.executable, "-m", "sluice", "broker", "--listen", "127.0.0.1:0", "--store", str(tmp_path / "s"),
            "--tls-mode", "enforcing", "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", certs.key_file]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot use TLS certificate" in done.stderr
    argv = argv[:-6] + ["--tls-mode", "permissive"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "tls_mode permissive needs tls_cert and tls_key" in done.stderr
    done = subprocess.run([sys.executable, "-m", "sluice", "namesrv", "--listen", "127.0.0.1:0", "--tls-mode",
                           "enforcing", "--tls-cert", certs.cert_file, "--tls-key", certs.ca_file],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot use TLS certificate" in done.stderr


def test_mutual_tls_cluster_needs_client_certificates(tmp_path: Path, certs: Certs) -> None:
    """--tls-client-ca on both servers: the broker registers with its own certificate (namesrv_tls_cert /
    namesrv_tls_key in its TOML), SDK clients with theirs; a TLS client without one is refused."""
    broker_cert, broker_key = certs.client_files("broker-a")
    client_cert, client_key = certs.client_files("app-1")
    mtls = [*certs.server_args("enforcing"), "--tls-client-ca", certs.ca_file]
    toml = (f'namesrv_tls = true\nnamesrv_tls_ca = "{certs.ca_file}"\n'
            f'namesrv_tls_cert = "{broker_cert}"\nnamesrv_tls_key = "{broker_key}"\n')
    client_tls = certs.client(cert=client_cert, key=client_key)
    with running_cluster(tmp_path, ("broker-a",), *mtls, config=toml, namesrv_extra=mtls,
                         client_tls=client_tls) as c:
        tls = {"tls": True, "tls_ca": certs.ca_file, "tls_cert": client_cert, "tls_key": client_key}
        got = send_and_pull(c.ns, "TopicMutualTls", [b"m1", b"m2"], tls, tls, tls_route=client_tls)
        assert sorted(got) == [b"m1", b"m2"]
        with Producer("PG_no_client_cert", c.ns, tls=True, tls_ca=certs.ca_file, retry_times=0,
                      send_timeout=5) as p:
            with pytest.raises(SluiceError):
                p.send(Message("TopicMutualTls", b"x"))
        c.namesrv.wait_for_stderr("TLS handshake with")
