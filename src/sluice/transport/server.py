"""The asyncio remoting server: accepts connections and dispatches their requests by code.

::

    server = RemotingServer("127.0.0.1", 9876)
    server.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, handle_route)   # (conn, request) -> response, sync or async
    server.on_connection_close(lambda conn: forget(conn))
    await server.start()
    ...
    await server.close()

A malformed or oversized frame closes only the connection it came on.
"""
from __future__ import annotations

import asyncio
import logging

from sluice.errors import RemotingError
from sluice.transport.connection import (
    DEFAULT_MAX_INFLIGHT, CloseCallback, Dispatcher, RemotingConnection, RequestHandler,
)
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE

__all__ = ["RemotingServer"]

log = logging.getLogger(__name__)


class RemotingServer:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, dispatcher: Dispatcher | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ) -> None:
        self.host = host
        self.max_inflight = max_inflight
        self.port = port
        self.dispatcher = dispatcher or Dispatcher()
        self.max_frame_size = max_frame_size
        self.connections: set[RemotingConnection] = set()
        self._open_callbacks: list[CloseCallback] = []
        self._close_callbacks: list[CloseCallback] = []
        self._server: asyncio.Server | None = None

    def register(self, code: int, handler: RequestHandler) -> None:
        self.dispatcher.register(code, handler)

    def on_connection_open(self, callback: CloseCallback) -> None:
        self._open_callbacks.append(callback)

    def on_connection_close(self, callback: CloseCallback) -> None:
        """``callback(conn)`` runs once per connection when it closes, for whatever reason."""
        self._close_callbacks.append(callback)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RemotingError("server already started")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, self.host, self.port, reuse_address=True)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("remoting server listening on %s", self.address)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stop accepting, close every connection (failing their pending requests), wait for it."""
        if self._server is not None:
            self._server.close()
        conns = list(self.connections)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _new_connection(self) -> RemotingConnection:
        return RemotingConnection(dispatcher=self.dispatcher, max_frame_size=self.max_frame_size,
                                  max_inflight=self.max_inflight, on_open=self._opened)

    def _opened(self, conn: RemotingConnection) -> None:
        self.connections.add(conn)
        conn.on_close(self._closed)
        for cb in self._open_callbacks:
            try:
                cb(conn)
            except Exception:
                log.exception("connection open callback %r failed", cb)

    def _closed(self, conn: RemotingConnection) -> None:
        self.connections.discard(conn)
        for cb in self._close_callbacks:
            try:
                cb(conn)
            except Exception:
                log.exception("connection close callback %r failed", cb)
