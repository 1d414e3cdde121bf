"""Throwaway TLS certificates for tests, made with trustme: a CA and a server certificate for 127.0.0.1 and
localhost, written as PEM files (what ``--tls-cert``, ``--tls-key`` and ``tls_ca=`` take)."""
from __future__ import annotations

from pathlib import Path

import trustme

from sluice.transport.tls import ClientTls

__all__ = ["Certs"]


class Certs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ca = trustme.CA()
        leaf = self.ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file = str(tmp / "ca.pem")
        self.cert_file = str(tmp / "server.pem")
        self.key_file = str(tmp / "server.key")
        self.ca.cert_pem.write_to_path(self.ca_file)
        leaf.private_key_pem.write_to_path(self.key_file)
        with open(self.cert_file, "wb") as f:
            for blob in leaf.cert_chain_pems:
                f.write(blob.bytes())

    def client(self, **kwargs: object) -> ClientTls:
        """Client settings trusting this CA (``kwargs``: server_name, verify)."""
        return ClientTls(ca=self.ca_file, **kwargs)  # type: ignore[arg-type]

    def client_files(self, name: str = "client-1") -> tuple[str, str]:
        """A client certificate (chain) and key signed by this CA, for mutual TLS: their paths."""
        leaf = self.ca.issue_cert(name)
        cert, key = self.tmp / f"{name}.pem", self.tmp / f"{name}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(key))
        return str(cert), str(key)

    def server_args(self, mode: str) -> list[str]:
        """``sluice namesrv`` / ``sluice broker`` arguments serving TLS in ``mode``."""
        return ["--tls-mode", mode, "--tls-cert", self.cert_file, "--tls-key", self.key_file]
