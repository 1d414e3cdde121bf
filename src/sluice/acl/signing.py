"""A RemotingClient that signs every request it sends (RocketMQ's RPCHook on the client side)."""
from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from sluice.acl.signature import Credentials, sign_fields
from sluice.protocol.command import RemotingCommand
from sluice.transport.client import DEFAULT_TIMEOUT, RemotingClient
from sluice.transport.connection import RemotingConnection, ResponseWaiter

__all__ = ["SigningRemotingClient", "remoting_client"]


class SigningRemotingClient(RemotingClient):
    """Signs each request with ``credentials`` just before it leaves (again on a retry: the fields may change)."""

    def __init__(self, credentials: Credentials, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.credentials = credentials

    def invoke(self, addr: str, request: RemotingCommand,  # type: ignore[override]
               timeout: float = DEFAULT_TIMEOUT) -> Coroutine[Any, Any, RemotingCommand]:
        # Signs now and hands back the plain client's coroutine: no coroutine of its own to create and step
        # through per request. Awaited at once, as every caller does, it is the same as signing inside.
        sign_fields(self.credentials, request.ext_fields, request.body)
        return super().invoke(addr, request, timeout)

    def request_with(self, conn: RemotingConnection, request: RemotingCommand, timeout: float | None,
                     waiter: ResponseWaiter) -> int:
        sign_fields(self.credentials, request.ext_fields, request.body)
        return super().request_with(conn, request, timeout, waiter)

    def request_from_thread(self, addr: str, request: RemotingCommand, timeout: float,
                            waiter: ResponseWaiter) -> bool:
        # Signed here, on the caller's thread; when this returns False the caller goes through the loop,
        # whose request_with signs again (the same fields, the same signature).
        sign_fields(self.credentials, request.ext_fields, request.body)
        return self._write_from_thread(addr, request, timeout, waiter)

    async def invoke_oneway(self, addr: str, request: RemotingCommand) -> None:
        sign_fields(self.credentials, request.ext_fields, request.body)
        await super().invoke_oneway(addr, request)


def remoting_client(credentials: Credentials | None, **options: Any) -> RemotingClient:
    """A plain client without credentials, a signing one with them; ``options`` go to RemotingClient (``tls=``)."""
    return RemotingClient(**options) if credentials is None else SigningRemotingClient(credentials, **options)
