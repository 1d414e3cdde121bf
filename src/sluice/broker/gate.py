"""The broker's gate in front of every request handler: the ACL check, refusal while stopping, the count of
requests in flight (a graceful stop drains them) and the refusal log.

A plain-function handler stays one (the remoting layer answers it without a task) and may return an awaitable
for the requests it cannot answer at once, or a ``Deferred`` (broker/deferred.py) when it answers them itself
later (a held pull's callback: no task, no coroutine); an ``async def`` one stays async.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from sluice.broker.acl import acl_checked
from sluice.broker.deferred import Deferred
from sluice.errors import ServiceNotAvailableError, SluiceError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection, RequestHandler

__all__ = ["RequestGate", "acl_checked"]

log = logging.getLogger("sluice.broker.controller")  # the refusal lines keep the logger operators filter on


class RequestGate:
    """Wraps handlers (:meth:`guard`); ``stopping`` refuses new requests, ``in_flight`` counts the others."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.stopping = False

    def guard(self, handler: RequestHandler) -> RequestHandler:
        """Refuse work while stopping, count requests in flight, log refusals."""
        if asyncio.iscoroutinefunction(handler):
            async def guarded(conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
                if self.stopping:
                    raise ServiceNotAvailableError("the broker is shutting down")
                self.in_flight += 1
                try:
                    return await handler(conn, request)
                except SluiceError as exc:
                    log_refusal(conn, request, exc)
                    raise
                finally:
                    self.in_flight -= 1
            return guarded

        def guarded_now(conn: RemotingConnection, request: RemotingCommand) -> Any:
            if self.stopping:
                raise ServiceNotAvailableError("the broker is shutting down")
            self.in_flight += 1
            try:
                result = handler(conn, request)
            except BaseException as exc:
                self.in_flight -= 1
                if isinstance(exc, SluiceError):
                    log_refusal(conn, request, exc)
                raise
            if result is None or isinstance(result, RemotingCommand):
                self.in_flight -= 1
                return result
            if type(result) is Deferred:  # still in flight until the handler's own answer settles it
                if result.settled:  # answered (or dropped) already
                    self._settled(conn, request, result.exc)
                else:
                    result.on_settle = lambda exc: self._settled(conn, request, exc)
                return None
            return self._finish(conn, request, result)
        return guarded_now

    def _settled(self, conn: RemotingConnection, request: RemotingCommand, exc: BaseException | None) -> None:
        """A Deferred request was answered by its handler's callback."""
        self.in_flight -= 1
        if isinstance(exc, SluiceError):
            log_refusal(conn, request, exc)

    async def _finish(self, conn: RemotingConnection, request: RemotingCommand,
                      pending: Awaitable[RemotingCommand | None]) -> RemotingCommand | None:
        """The rest of a plain handler's request that had to wait (a held pull, say), still counted."""
        try:
            return await pending
        except SluiceError as exc:
            log_refusal(conn, request, exc)
            raise
        finally:
            self.in_flight -= 1


def log_refusal(conn: RemotingConnection, request: RemotingCommand, exc: SluiceError) -> None:
    level = logging.WARNING if exc.code == ResponseCode.SYSTEM_ERROR else logging.DEBUG
    log.log(level, "request code %d from %s refused (%s): %s", request.code, conn.peer,
            getattr(exc.code, "name", exc.code), exc)
