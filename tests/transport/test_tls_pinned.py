"""ClientTls(pinned=True): the CA file is the server's own certificate, trusted as it is and whatever names it
carries (a broker's filter-server children reach it so); another certificate, even from the same issuing CA,
and for the same names, is refused. A chain file pins its first (leaf) certificate, not its intermediates."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trustme

from sluice.errors import InvalidParameterError, RemotingError
from sluice.protocol.command import RemotingCommand
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.server import RemotingServer
from sluice.transport.tls import ClientTls, server_context

ECHO = 9001


def write_leaf(ca: trustme.CA, tmp: Path, name: str) -> tuple[str, str]:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


async def serve(cert: str, key: str) -> RemotingServer:
    server = RemotingServer("127.0.0.1", 0, tls_mode="enforcing", ssl_context=server_context(cert, key))

    def echo(conn: RemotingConnection, req: RemotingCommand) -> RemotingCommand:
        return req.make_response(body=req.body)
    server.register(ECHO, echo)
    await server.start()
    return server


async def reaches(tls: ClientTls, addr: str) -> bool:
    client = RemotingClient(tls=tls)
    try:
        resp = await client.invoke(addr, RemotingCommand.request(ECHO, {}, b"ping"), timeout=5)
        return resp.body == b"ping"
    except RemotingError as exc:
        assert "CERTIFICATE_VERIFY_FAILED" in str(exc)
        return False
    finally:
        await client.close()


@pytest.mark.parametrize("intermediate", [False, True], ids=["root-issued", "intermediate-issued"])
def test_pinned_trusts_exactly_the_servers_certificate(tmp_path: Path, intermediate: bool) -> None:
    root = trustme.CA()
    issuer = root.create_child_ca() if intermediate else root
    cert, key = write_leaf(issuer, tmp_path, "server")
    other_cert, other_key = write_leaf(issuer, tmp_path, "impostor")  # same issuer, same names

    async def main() -> None:
        server, impostor = await serve(cert, key), await serve(other_cert, other_key)
        try:
            pinned = ClientTls(ca=cert, pinned=True)
            assert await reaches(pinned, server.address)
            # the address need not be a name in the certificate: the pin is the check
            assert await reaches(ClientTls(ca=cert, pinned=True, server_name="not-in-the-cert.example"),
                                 server.address)
            assert not await reaches(pinned, impostor.address)
            assert not await reaches(ClientTls(ca=cert), server.address)  # unpinned: a leaf is no CA
        finally:
            await server.close()
            await impostor.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_pinned_needs_a_certificate_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="pinned"):
        ClientTls(pinned=True).context()
    (tmp_path / "empty.pem").write_text("nothing here\n")
    with pytest.raises(InvalidParameterError, match="no PEM certificate"):
        ClientTls(ca=str(tmp_path / "empty.pem"), pinned=True).context()
