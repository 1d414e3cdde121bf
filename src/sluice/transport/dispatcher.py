"""The request table of a remoting connection: code -> handler, and the reply rules every handler gets.

Split from connection.py so the protocol class stays one job; connection.py
re-exports these names.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from sluice.errors import RemotingError, RequestCodeNotSupportedError, SluiceError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand

__all__ = ["Dispatcher", "RequestHandler", "split_addr"]

log = logging.getLogger("sluice.transport.connection")


class Peer(Protocol):
    """What the reply rules need of a connection (RemotingConnection; no import back to it)."""

    peer: str


#: ``handler(conn, request)``: an ``async def``, or a plain function returning a response, None or an awaitable.
RequestHandler = Callable[[Any, RemotingCommand],
                          Awaitable[RemotingCommand | None] | RemotingCommand | None]

def split_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) to ``(host, port)``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RemotingError(f"bad address {addr!r}: expected host:port")
    return host.strip("[]"), int(port)


def _is_async(fn: Callable[..., Any]) -> bool:
    return asyncio.iscoroutinefunction(fn) or asyncio.iscoroutinefunction(getattr(fn, "__call__", None))


class Dispatcher:
    """A table of request code -> handler, and the reply rules every handler gets.

    A handler is called as ``handler(conn, request)`` and may be

    * an ``async def`` returning ``RemotingCommand | None``: it runs in a task of its own;
    * a plain function returning ``RemotingCommand | None``: called as the frame is decoded and
      answered at once, with no task (the cheap path for handlers that never wait);
    * a plain function returning an awaitable: the awaitable then runs in a task, as above.

    The reply rules, the same for all three (an exception raised by a plain
    function is treated like one raised by an awaited coroutine): an unknown
    code gets REQUEST_CODE_NOT_SUPPORTED naming the code; a SluiceError becomes
    its ``.code`` with ``str(err)`` as remark; any other exception is logged and
    answered SYSTEM_ERROR; oneway requests get no reply. A handler returning
    ``None`` sends nothing (it may answer later itself with
    ``conn.send(request.make_response(...))``). Responses go out with the
    request's opaque and serialize type and the response flag set, whatever the
    handler put in them.
    """

    def __init__(self, handlers: Mapping[int, RequestHandler] | None = None) -> None:
        self._handlers: dict[int, RequestHandler] = {}
        #: code -> (handler, is ``async def``); read directly by RemotingConnection.
        self._table: dict[int, tuple[RequestHandler, bool]] = {}
        for code, handler in (handlers or {}).items():
            self.register(code, handler)

    def register(self, code: int, handler: RequestHandler) -> None:
        self._handlers[int(code)] = handler
        self._table[int(code)] = (handler, _is_async(handler))

    def __contains__(self, code: int) -> bool:
        return code in self._handlers

    def error_response(self, conn: Peer, request: RemotingCommand, exc: Exception) -> RemotingCommand:
        """The reply to a request whose handler raised ``exc`` (logged unless it is a SluiceError)."""
        if isinstance(exc, SluiceError):
            return request.make_response(exc.code, str(exc))
        log.error("handler for request code %d from %s failed", request.code, conn.peer, exc_info=exc)
        return request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    def unsupported(self, conn: Peer, request: RemotingCommand) -> RemotingCommand:
        return self.error_response(conn, request, RequestCodeNotSupportedError(
            f"request code {request.code} not supported"))

    async def handle(self, conn: Peer, request: RemotingCommand) -> RemotingCommand | None:
        """Run the handler for ``request`` to its reply (None for oneway requests); the rules above."""
        entry = self._table.get(request.code)
        if entry is None:
            response: RemotingCommand | None = self.unsupported(conn, request)
        else:
            try:
                result = entry[0](conn, request)
                response = result if result is None or isinstance(result, RemotingCommand) else await result
            except Exception as exc:
                response = self.error_response(conn, request, exc)
        return None if request.is_oneway else response
