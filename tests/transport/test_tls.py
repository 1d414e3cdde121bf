"""TLS on the remoting transport over real loopback sockets, with certificates made by trustme."""
from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trustme
from tls_certs import Certs

from sluice.errors import InvalidParameterError, RemotingError
from sluice.protocol.command import RemotingCommand
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.server import RemotingServer
from sluice.transport.tls import ClientTls, check_tls_mode, server_context, server_tls

ECHO = 9001
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("tls"))


def run(coro_fn: Callable[[], Awaitable[None]], timeout: float = 30.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro_fn()
    asyncio.run(bounded())


async def start_server(certs: Certs, mode: str, **kwargs: object) -> RemotingServer:
    ctx = server_context(certs.cert_file, certs.key_file) if mode != "disabled" else None
    server = RemotingServer("127.0.0.1", 0, tls_mode=mode, ssl_context=ctx, **kwargs)  # type: ignore[arg-type]

    def echo(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(ext_fields={"n": req.ext_fields.get("n", "")}, body=req.body)

    server.register(ECHO, echo)
    await server.start()
    return server


async def echo_once(client: RemotingClient, addr: str, body: bytes = b"hello", n: str = "1") -> RemotingCommand:
    resp = await client.invoke(addr, RemotingCommand.request(ECHO, {"n": n}, body), timeout=10)
    assert resp.body == body and resp.ext_fields["n"] == n
    return resp


async def until(cond: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    for _ in range(int(limit / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_enforcing_serves_tls_clients_with_big_frames_and_many_requests(certs: Certs) -> None:
    async def main() -> None:
        server = await start_server(certs, "enforcing")
        client = RemotingClient(tls=certs.client())
        try:
            await echo_once(client, server.address)
            big = bytes(range(256)) * (3 * MiB // 256)  # several TLS records and write-buffer pauses
            await echo_once(client, server.address, big, "big")
            await asyncio.gather(*(echo_once(client, server.address, str(i).encode(), str(i)) for i in range(200)))
            conn = await client.connection(server.address)
            assert conn._transport.get_extra_info("ssl_object") is not None  # type: ignore[union-attr]
            assert server.tls is not None and server.tls.tls == 1 and server.tls.plain == 0
            assert len(server.connections) == 1 and not server.tls.pending
        finally:
            await client.close()
            await server.close()
    run(main)


def test_permissive_serves_plain_and_tls_clients_on_one_port(certs: Certs) -> None:
    async def main() -> None:
        server = await start_server(certs, "permissive")
        tls_client, plain_client = RemotingClient(tls=certs.client()), RemotingClient()
        try:
            for i in range(3):  # interleaved, on the same port at the same time
                await asyncio.gather(echo_once(tls_client, server.address, b"tls%d" % i),
                                     echo_once(plain_client, server.address, b"plain%d" % i))
            tls_conn = await tls_client.connection(server.address)
            plain_conn = await plain_client.connection(server.address)
            assert tls_conn._transport.get_extra_info("ssl_object") is not None  # type: ignore[union-attr]
            assert plain_conn._transport.get_extra_info("ssl_object") is None  # type: ignore[union-attr]
            assert server.tls is not None and (server.tls.tls, server.tls.plain) == (1, 1)
            assert len(server.connections) == 2
        finally:
            await tls_client.close()
            await plain_client.close()
            await server.close()
    run(main)


def test_enforcing_refuses_plain_clients_with_a_rate_limited_log_line(
        certs: Certs, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server = await start_server(certs, "enforcing")
        tls_client = RemotingClient(tls=certs.client())
        try:
            for _ in range(3):
                plain_client = RemotingClient()
                with pytest.raises(RemotingError):
                    await plain_client.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
                await plain_client.close()
            assert server.tls is not None and server.tls.plain_refused == 3
            assert not server.connections and not server.tls.pending
            await echo_once(tls_client, server.address)  # TLS clients are still served
        finally:
            await tls_client.close()
            await server.close()
    with caplog.at_level(logging.WARNING, logger="sluice.transport.tls"):
        run(main)
    refusals = [r for r in caplog.records if "tls_mode is enforcing" in r.getMessage()]
    assert len(refusals) == 1  # three refusals, one line within the interval


def test_a_verifying_client_refuses_a_certificate_it_cannot_check(certs: Certs, tmp_path: Path) -> None:
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))

    async def main() -> None:
        server = await start_server(certs, "enforcing")
        try:
            wrong_ca = RemotingClient(tls=ClientTls(ca=str(tmp_path / "other-ca.pem")))
            with pytest.raises(RemotingError, match="TLS handshake .* failed.*CERTIFICATE_VERIFY_FAILED"):
                await wrong_ca.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
            await wrong_ca.close()
            wrong_name = RemotingClient(tls=certs.client(server_name="broker.example.com"))
            with pytest.raises(RemotingError, match="CERTIFICATE_VERIFY_FAILED"):
                await wrong_name.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
            await wrong_name.close()
            system_trust = RemotingClient(tls=ClientTls())  # the system's CAs do not know trustme's
            with pytest.raises(RemotingError, match="CERTIFICATE_VERIFY_FAILED"):
                await system_trust.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
            await system_trust.close()
            assert server.tls is not None
            await until(lambda: server.tls.handshake_failed == 3, "the server to count three failed handshakes")
            # Verification off (testing only) connects to the same server; the right name works too.
            for tls in (ClientTls(ca=str(tmp_path / "other-ca.pem"), verify=False), certs.client(server_name="localhost")):
                client = RemotingClient(tls=tls)
                await echo_once(client, server.address)
                await client.close()
            assert not server.tls.pending
        finally:
            await server.close()
    run(main)


def test_a_tls_client_of_a_plain_server_gets_a_precise_error(certs: Certs) -> None:
    async def main() -> None:
        server = await start_server(certs, "disabled")
        assert server.tls is None  # no sniffer: accepted sockets go straight to RemotingConnection
        client = RemotingClient(tls=certs.client(), connect_timeout=5)
        try:
            with pytest.raises(RemotingError, match="TLS handshake .* failed.*does the server speak TLS"):
                await client.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
            plain = RemotingClient()
            await echo_once(plain, server.address)
            await plain.close()
        finally:
            await client.close()
            await server.close()
    run(main)


def test_silent_and_stalled_handshakes_are_closed_and_count_toward_the_connection_limit(certs: Certs) -> None:
    async def main() -> None:
        server = await start_server(certs, "permissive", tls_handshake_timeout=0.5, max_connections=2)
        loop = asyncio.get_running_loop()
        silent = socket.create_connection(("127.0.0.1", server.port))
        stalled = socket.create_connection(("127.0.0.1", server.port))
        stalled.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
        for s in (silent, stalled):
            s.setblocking(False)
        try:
            assert server.tls is not None
            await until(lambda: len(server.tls.pending) == 2, "two pending handshakes")
            # The limit counts them: a third client is turned away while they are pending.
            late = RemotingClient(tls=certs.client())
            with pytest.raises(RemotingError):
                await late.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
            await late.close()
            assert server.refused == 1
            for s in (silent, stalled):  # the server closes both: EOF
                assert await asyncio.wait_for(loop.sock_recv(s, 100), 10) == b""
            assert not server.tls.pending and server.tls.handshake_failed == 2
            client = RemotingClient(tls=certs.client())
            await echo_once(client, server.address)
            await client.close()
        finally:
            silent.close()
            stalled.close()
            await server.close()
    run(main)


def test_server_close_closes_connections_still_in_their_handshake(certs: Certs) -> None:
    async def main() -> None:
        server = await start_server(certs, "enforcing")
        loop = asyncio.get_running_loop()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setblocking(False)
        try:
            assert server.tls is not None
            await until(lambda: len(server.tls.pending) == 1, "a pending handshake")
            await server.close()
            assert await asyncio.wait_for(loop.sock_recv(sock, 100), 10) == b""
            assert not server.tls.pending
        finally:
            sock.close()
    run(main)


def test_settings_are_checked_with_precise_errors(certs: Certs, tmp_path: Path) -> None:
    assert check_tls_mode("ENFORCING") == "enforcing"
    with pytest.raises(InvalidParameterError, match="tls_mode must be one of disabled, permissive, enforcing"):
        check_tls_mode("strict")
    assert server_tls("disabled", None, None) == ("disabled", None)
    with pytest.raises(InvalidParameterError, match="tls_mode permissive needs tls_cert and tls_key"):
        server_tls("permissive", certs.cert_file, "")
    with pytest.raises(InvalidParameterError, match="cannot use TLS certificate"):
        server_tls("enforcing", str(tmp_path / "missing.pem"), certs.key_file)
    with pytest.raises(InvalidParameterError, match="cannot use TLS certificate"):
        server_tls("enforcing", certs.ca_file, certs.key_file)  # a key that does not match
    mode, ctx = server_tls("Permissive", certs.cert_file, certs.key_file)
    assert mode == "permissive" and ctx is not None
    with pytest.raises(InvalidParameterError, match="cannot read TLS CA file"):
        ClientTls(ca=str(tmp_path / "missing-ca.pem")).context()
    with pytest.raises(InvalidParameterError, match="cannot read TLS CA file"):
        RemotingClient(tls=ClientTls(ca=certs.key_file))
    with pytest.raises(ValueError, match="needs an ssl_context"):
        RemotingServer("127.0.0.1", 0, tls_mode="enforcing")


def test_mutual_tls_requires_a_client_certificate_signed_by_the_client_ca(certs: Certs, tmp_path: Path) -> None:
    cert, key = certs.client_files("client-ok")
    stranger = Certs(tmp_path)  # another CA: its client certificates are not accepted
    bad_cert, bad_key = stranger.client_files("client-stranger")

    async def main() -> None:
        ctx = server_context(certs.cert_file, certs.key_file, client_ca=certs.ca_file)
        server = RemotingServer("127.0.0.1", 0, tls_mode="permissive", ssl_context=ctx)
        server.register(ECHO, lambda conn, req: req.make_response(ext_fields={"n": req.ext_fields.get("n", "")},
                                                                  body=req.body))
        await server.start()
        try:
            for tls in (certs.client(), certs.client(cert=bad_cert, key=bad_key)):
                client = RemotingClient(tls=tls)
                with pytest.raises(RemotingError):  # refused in the handshake or at the first read (TLS 1.3)
                    await client.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
                await client.close()
            assert server.tls is not None
            await until(lambda: server.tls.handshake_failed == 2, "two refused client certificates")
            client = RemotingClient(tls=certs.client(cert=cert, key=key))
            await echo_once(client, server.address)
            await client.close()
            plain = RemotingClient()  # permissive: plain clients are not asked for certificates
            await echo_once(plain, server.address)
            await plain.close()
        finally:
            await server.close()
    run(main)


def test_mutual_tls_settings_are_checked(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="tls_client_ca needs tls_mode permissive or enforcing"):
        server_tls("disabled", None, None, client_ca=certs.ca_file)
    with pytest.raises(InvalidParameterError, match="cannot read TLS client CA file"):
        server_tls("enforcing", certs.cert_file, certs.key_file, client_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(InvalidParameterError, match="needs both its cert and its key"):
        ClientTls(cert=certs.cert_file).context()
    with pytest.raises(InvalidParameterError, match="cannot use TLS client certificate"):
        ClientTls(cert=certs.cert_file, key=str(tmp_path / "missing.key")).context()


def test_a_failed_handshake_is_logged_with_a_reason(certs: Certs, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # A client that does not trust the server's certificate aborts the handshake; the server's warning must
    # still say what happened (the exception it gets can have an empty str()).
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))

    async def main() -> None:
        server = await start_server(certs, "enforcing")
        try:
            wrong_ca = RemotingClient(tls=ClientTls(ca=str(tmp_path / "other-ca.pem")))
            with pytest.raises(RemotingError, match="CERTIFICATE_VERIFY_FAILED"):
                await wrong_ca.invoke(server.address, RemotingCommand.request(ECHO, {}), timeout=5)
            await wrong_ca.close()
            assert server.tls is not None
            await until(lambda: server.tls.handshake_failed == 1, "the server to count the failed handshake")
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="sluice.transport.tls"):
        run(main)
    failures = [r.getMessage() for r in caplog.records if "TLS handshake with" in r.getMessage()]
    assert failures, caplog.text
    for line in failures:
        reason = line.split(" failed: ", 1)[1]
        assert "closed the connection during the handshake" in reason, line
