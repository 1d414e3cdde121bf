"""The asyncio remoting client: one pooled connection per ``host:port``, opened on first use.

::

    client = RemotingClient()
    resp = await client.invoke("127.0.0.1:9876", RemotingCommand.request(105, {"topic": "T"}), timeout=3)
    await client.close()

A connection that closes fails its pending requests with RemotingError and is
replaced on the next call. Requests the server sends on a client connection
(NOTIFY_CONSUMER_IDS_CHANGED, ...) go to handlers registered with :meth:`register`.
With ``tls=ClientTls(...)`` (transport/tls.py) every connection is TLS, its server's certificate
checked against the CA file unless ``verify`` is off.

Plain (not TLS) connections also take requests written from other threads
(:meth:`RemotingClient.request_from_thread`, transport/thread_writes.py): the
blocking SDK's sends leave from the caller's thread without waking the loop.
"""
from __future__ import annotations

import asyncio
import logging
import ssl

from sluice.errors import RemotingError, RemotingTimeoutError
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import Dispatcher, RemotingConnection, RequestHandler, ResponseWaiter, split_addr
from sluice.transport.thread_writes import ThreadWritableConnection
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE
from sluice.transport.tls import ClientTls

__all__ = ["RemotingClient"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 3.0  # RocketMQ's sendMsgTimeout


class RemotingClient:
    def __init__(
        self, *, connect_timeout: float = 3.0, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        dispatcher: Dispatcher | None = None, tls: ClientTls | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.tls = tls
        self._ssl: ssl.SSLContext | None = tls.context() if tls is not None else None
        self.max_frame_size = max_frame_size
        self.dispatcher = dispatcher or Dispatcher()
        self._conns: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._closed = False

    def register(self, code: int, handler: RequestHandler) -> None:
        """Handle requests the server sends to us on our connections."""
        self.dispatcher.register(code, handler)

    def address_of(self, conn: RemotingConnection) -> str | None:
        """The address ``conn`` was opened to (a server's request came on it), or None if not ours."""
        return next((a for a, c in self._conns.items() if c is conn), None)

    async def connection(self, addr: str) -> RemotingConnection:
        """The live connection to ``addr``, connecting (once, even if called concurrently) if needed."""
        if self._closed:
            raise RemotingError("remoting client is closed")
        conn = self._conns.get(addr)
        if conn is not None and not conn.is_closed:
            return conn
        lock = self._connecting.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is not None and not conn.is_closed:
                return conn
            host, port = split_addr(addr)
            loop = asyncio.get_running_loop()
            tls = {} if self._ssl is None else {
                "ssl": self._ssl, "server_hostname": self.tls.server_name or host,  # type: ignore[union-attr]
                "ssl_handshake_timeout": self.connect_timeout}
            try:
                async with asyncio.timeout(self.connect_timeout):
                    _, conn = await loop.create_connection(self._new_connection, host, port, **tls)
            except TimeoutError:
                raise RemotingTimeoutError(f"connect to {addr} timed out after {self.connect_timeout:g} s") from None
            except ssl.SSLError as exc:  # before OSError, its base: name the TLS part
                hint = "" if isinstance(exc, ssl.SSLCertVerificationError) else " (does the server speak TLS?)"
                raise RemotingError(f"TLS handshake with {addr} failed: {exc}{hint}") from exc
            except ConnectionError as exc:
                if self._ssl is not None and not isinstance(exc, ConnectionRefusedError):
                    # a plain server closes on a TLS hello (it reads a frame length far over its limit)
                    raise RemotingError(f"TLS handshake with {addr} failed: {exc} (does the server speak TLS?)") from exc
                raise RemotingError(f"cannot connect to {addr}: {exc}") from exc
            except OSError as exc:
                raise RemotingError(f"cannot connect to {addr}: {exc}") from exc
            conn.on_close(lambda c, addr=addr: self._forget(addr, c))
            if not conn.is_closed:
                self._conns[addr] = conn
            return conn

    def _new_connection(self) -> RemotingConnection:
        if self._ssl is not None:  # TLS records are the transport's to write
            return RemotingConnection(dispatcher=self.dispatcher, max_frame_size=self.max_frame_size)
        return ThreadWritableConnection(dispatcher=self.dispatcher, max_frame_size=self.max_frame_size)

    async def invoke(self, addr: str, request: RemotingCommand, timeout: float = DEFAULT_TIMEOUT) -> RemotingCommand:
        """Send ``request`` to ``addr`` and return the response, whatever its code."""
        conn = self._conns.get(addr)  # the common case without another coroutine
        if conn is None or conn.is_closed:
            conn = await self.connection(addr)
        return await conn.request(request, timeout)

    def open_connection(self, addr: str) -> RemotingConnection | None:
        """The connection to ``addr`` if it is open and takes writes now, else None (then :meth:`invoke`)."""
        conn = self._conns.get(addr)
        return conn if conn is not None and conn.writable else None

    def request_with(self, conn: RemotingConnection, request: RemotingCommand, timeout: float | None,
                     waiter: ResponseWaiter) -> int:
        """Write ``request`` on ``conn`` (one of :meth:`open_connection`'s) with ``waiter`` for its response, as
        ``RemotingConnection.request_with``: the callback twin of :meth:`invoke`. Returns the request's opaque."""
        return conn.request_with(request, timeout, waiter)

    def request_from_thread(self, addr: str, request: RemotingCommand, timeout: float,
                            waiter: ResponseWaiter) -> bool:
        """From a thread other than the loop's: write ``request`` to ``addr`` now, on this thread, with ``waiter``
        for its response (answered on the loop thread, as :meth:`request_with`'s), if the connection is open
        and has nothing else waiting to be written. False when it cannot (nothing was sent, ``waiter`` is not
        registered): then go through the loop. A subclass that changes requests on their way out (by overriding
        :meth:`request_with`, as the signing client does) gets False unless it overrides this too."""
        if type(self).request_with is not RemotingClient.request_with:
            return False
        return self._write_from_thread(addr, request, timeout, waiter)

    def _write_from_thread(self, addr: str, request: RemotingCommand, timeout: float,
                           waiter: ResponseWaiter) -> bool:
        conn = self._conns.get(addr)
        if type(conn) is not ThreadWritableConnection:
            return False
        return conn.request_from_thread(request, timeout, waiter)

    async def invoke_oneway(self, addr: str, request: RemotingCommand) -> None:
        conn = await self.connection(addr)
        await conn.send_oneway(request)

    async def close(self) -> None:
        self._closed = True
        conns, self._conns = list(self._conns.values()), {}
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    def _forget(self, addr: str, conn: RemotingConnection) -> None:
        if self._conns.get(addr) is conn:
            del self._conns[addr]
