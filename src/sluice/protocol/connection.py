"""One remoting connection over asyncio streams, used the same way by servers and clients.

Either side may send requests on it: a request gets an opaque from this
connection's counter and a Future in ``_pending``; the reader task resolves it
when a response with that opaque arrives (responses may come in any order).
Requests from the peer are handed to a :class:`Dispatcher`, each in its own
task, so a slow handler (a long-polling pull) never blocks the connection.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from sluice.errors import RemotingError, RemotingTimeoutError, RequestCodeNotSupportedError, SluiceError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE, NEED_DATA, FrameCodec, encode_frame_parts

__all__ = ["DEFAULT_MAX_INFLIGHT", "CloseCallback", "Dispatcher", "RemotingConnection", "RequestHandler", "split_addr"]

log = logging.getLogger(__name__)

RequestHandler = Callable[["RemotingConnection", RemotingCommand], Awaitable[RemotingCommand | None]]
CloseCallback = Callable[["RemotingConnection"], None]

_READ_CHUNK = 256 * 1024
#: Requests from the peer being handled at once on one connection; beyond it we stop reading (backpressure).
DEFAULT_MAX_INFLIGHT = 4096


def split_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) to ``(host, port)``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RemotingError(f"bad address {addr!r}: expected host:port")
    return host.strip("[]"), int(port)


class Dispatcher:
    """A table of request code -> ``async handler(conn, request) -> response | None``.

    The reply rules: an unknown code gets REQUEST_CODE_NOT_SUPPORTED naming the
    code; a SluiceError becomes its ``.code`` with ``str(err)`` as remark; any
    other exception is logged and answered SYSTEM_ERROR; oneway requests get
    no reply. A handler returning ``None`` sends nothing (it may answer later
    itself with ``conn.send(request.make_response(...))``).
    """

    def __init__(self, handlers: Mapping[int, RequestHandler] | None = None) -> None:
        self._handlers: dict[int, RequestHandler] = dict(handlers or {})

    def register(self, code: int, handler: RequestHandler) -> None:
        self._handlers[int(code)] = handler

    def __contains__(self, code: int) -> bool:
        return code in self._handlers

    async def handle(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        handler = self._handlers.get(request.code)
        try:
            if handler is None:
                raise RequestCodeNotSupportedError(f"request code {request.code} not supported")
            response = await handler(conn, request)
        except SluiceError as exc:
            response = request.make_response(exc.code, str(exc))
        except Exception as exc:
            log.exception("handler for request code %d from %s failed", request.code, conn.peer)
            response = request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        return None if request.is_oneway else response


class RemotingConnection:
    """A framed connection: ``request``/``send_oneway`` out, dispatch in; call :meth:`start` once."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
        dispatcher: Dispatcher | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ) -> None:
        self._reader = reader
        self._max_inflight = max_inflight
        self._slot_free = asyncio.Event()
        self._writer = writer
        self._dispatcher = dispatcher
        self._codec = FrameCodec(max_frame_size)
        self._opaques = itertools.count(1)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self._close_callbacks: list[CloseCallback] = []
        self._reader_task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: Free for the owner's per-connection state (e.g. the broker's client id).
        self.attributes: dict[str, Any] = {}

    # -------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._reader_task is None:
            self._reader_task = asyncio.get_running_loop().create_task(self._read_loop(), name=f"remoting-read-{self.peer}")

    @property
    def is_closed(self) -> bool:
        return self._closed.is_set()

    def on_close(self, callback: CloseCallback) -> None:
        """Call ``callback(conn)`` once when the connection closes (at once if it already has)."""
        if self.is_closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self) -> None:
        self._shutdown("closed locally")
        task = self._reader_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self._writer.wait_closed()
        except (OSError, asyncio.CancelledError, RuntimeError):
            pass

    # -------------------------------------------------------------------------------- sending

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its response (any code; see ``RemotingCommand.raise_for_code``)."""
        if self.is_closed:
            raise RemotingError(f"connection to {self.peer} is closed")
        opaque = next(self._opaques) & 0x7FFFFFFF
        fut: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = fut
        try:
            async with asyncio.timeout(timeout):
                await self.send(replace(cmd, opaque=opaque, flag=cmd.flag & ~(FLAG_RESPONSE | FLAG_ONEWAY)))
                return await fut
        except TimeoutError:
            raise RemotingTimeoutError(
                f"no response to request code {cmd.code} from {self.peer} within {timeout:g} s") from None
        finally:
            self._pending.pop(opaque, None)

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        opaque = next(self._opaques) & 0x7FFFFFFF
        await self.send(replace(cmd, opaque=opaque, flag=(cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE))

    async def send(self, cmd: RemotingCommand) -> None:
        """Write one command as is (a response must carry its request's opaque)."""
        if self.is_closed:
            raise RemotingError(f"connection to {self.peer} is closed")
        head, body = encode_frame_parts(cmd)
        try:
            # Two writes with no await between them cannot interleave with another frame.
            self._writer.write(head)
            if body:
                self._writer.write(body)
            await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            self._shutdown(f"write failed: {exc}")
            raise RemotingError(f"connection to {self.peer} failed while writing: {exc}") from exc

    # -------------------------------------------------------------------------------- receiving

    async def _read_loop(self) -> None:
        reason = "closed by peer"
        try:
            while True:
                data = await self._reader.read(_READ_CHUNK)
                self._codec.receive_data(data)
                while (frame := self._codec.next_frame()) is not NEED_DATA:
                    self._on_frame(frame)  # type: ignore[arg-type]
                    while len(self._handler_tasks) >= self._max_inflight:
                        self._slot_free.clear()
                        await self._slot_free.wait()
                if not data:
                    break
        except SluiceError as exc:  # ProtocolError: the stream cannot be resynchronised
            reason = f"protocol error: {exc}"
            log.warning("closing connection %s: %s", self.peer, exc)
        except (ConnectionError, OSError) as exc:
            reason = f"connection error: {exc}"
        except asyncio.CancelledError:
            reason = "closed locally"
        finally:
            self._shutdown(reason)

    def _on_frame(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            fut = self._pending.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            else:
                log.debug("response with unknown opaque %d from %s dropped (timed out?)", cmd.opaque, self.peer)
            return
        task = asyncio.get_running_loop().create_task(self._serve(cmd))
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_done)

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handler_tasks.discard(task)
        self._slot_free.set()

    async def _serve(self, request: RemotingCommand) -> None:
        dispatcher = self._dispatcher or _NO_HANDLERS
        response = await dispatcher.handle(self, request)
        if response is None or request.is_oneway or self.is_closed:
            return
        try:
            await self.send(replace(response, opaque=request.opaque, flag=response.flag | FLAG_RESPONSE,
                                    serialize_type=request.serialize_type))
        except RemotingError as exc:
            log.debug("could not answer request code %d from %s: %s", request.code, self.peer, exc)

    def _shutdown(self, reason: str) -> None:
        if self.is_closed:
            return
        self._closed.set()
        log.debug("connection %s closed: %s", self.peer, reason)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(RemotingError(f"connection to {self.peer} closed ({reason})"))
        for task in list(self._handler_tasks):
            if task is not asyncio.current_task():
                task.cancel()
        try:
            self._writer.close()
        except RuntimeError:  # the event loop is already closed
            pass
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("connection close callback %r failed", cb)


_NO_HANDLERS = Dispatcher()
