"""The asyncio remoting server: accepts connections and dispatches their requests by code.

::

    server = RemotingServer("127.0.0.1", 9876)
    server.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, handle_route)   # (conn, request) -> response, sync or async
    server.on_connection_close(lambda conn: forget(conn))
    await server.start()
    ...
    await server.close()

A malformed or oversized frame closes only the connection it came on. Bounds (transport/limits.py):
``frame_budget`` bytes for big frames being received over all connections (a connection whose frame
does not fit stops reading until it does), ``max_connections`` (more are closed at accept, with a
rate-limited log line) and ``idle_timeout`` (a connection with no complete frame received, no handler
answering and no request of either side outstanding for that long is closed; 0 turns it off).

TLS (transport/tls.py): ``tls_mode`` ``"disabled"`` (the default: accepted sockets go straight to
RemotingConnection, as without TLS), ``"permissive"`` (TLS and plain clients on the one port) or
``"enforcing"`` (TLS only), with ``ssl_context`` from ``tls.server_context(cert, key)``.
"""
from __future__ import annotations

import asyncio
import logging
import ssl

from sluice.errors import RemotingError
from sluice.transport.connection import (
    DEFAULT_MAX_INFLIGHT, CloseCallback, Dispatcher, RemotingConnection, RequestHandler,
)
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE
from sluice.transport.limits import (
    DEFAULT_FRAME_BUDGET, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, FrameBudget, RateLimitedLog,
)
from sluice.transport.tls import DEFAULT_HANDSHAKE_TIMEOUT, TlsAcceptor, check_tls_mode

__all__ = ["RemotingServer"]

log = logging.getLogger(__name__)


class RemotingServer:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, dispatcher: Dispatcher | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, max_inflight: int = DEFAULT_MAX_INFLIGHT,
        frame_budget: int = DEFAULT_FRAME_BUDGET, max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT, tls_mode: str = "disabled",
        ssl_context: ssl.SSLContext | None = None, tls_handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections {max_connections} must be positive")
        if idle_timeout < 0:
            raise ValueError(f"idle_timeout {idle_timeout} must not be negative (0 turns it off)")
        self.host = host
        self.max_inflight = max_inflight
        self.port = port
        self.dispatcher = dispatcher or Dispatcher()
        self.max_frame_size = max_frame_size
        self.connections: set[RemotingConnection] = set()
        self._open_callbacks: list[CloseCallback] = []
        self._close_callbacks: list[CloseCallback] = []
        self._server: asyncio.Server | None = None
        self.budget = FrameBudget(frame_budget)
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        #: Connections refused at accept (over max_connections) and closed for idleness, so far.
        self.refused = 0
        self.idle_closed = 0
        self.accept_errors = 0  # accepts that failed for want of descriptors (EMFILE)
        self._refusals = RateLimitedLog(log)
        self._idle_task: asyncio.Task[None] | None = None
        mode = check_tls_mode(tls_mode)
        #: Permissive or enforcing: the sniffer every accepted socket starts with (None when disabled).
        self.tls: TlsAcceptor | None = None
        if mode != "disabled":
            if ssl_context is None:
                raise ValueError(f"tls_mode {mode} needs an ssl_context (sluice.transport.tls.server_context)")
            self.tls = TlsAcceptor(mode, ssl_context, self._new_connection, self._full, tls_handshake_timeout)
        self.tls_mode = mode

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
        factory = self._new_connection if self.tls is None else self.tls.protocol
        self._server = await loop.create_server(factory, self.host, self.port, reuse_address=True)
        self._quiet_accept_errors(loop)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        if self.idle_timeout:
            self._idle_task = loop.create_task(self._close_idle(), name=f"idle-check-{self.port}")
        log.info("remoting server listening on %s%s", self.address,
                 "" if self.tls is None else f" (TLS {self.tls_mode})")

    def _quiet_accept_errors(self, loop: asyncio.AbstractEventLoop) -> None:
        """Out of descriptors (EMFILE) at accept: asyncio stops accepting for a second and retries (its
        selector_events._accept_connection), reporting each time with a traceback; here that is one
        rate-limited line, counted in ``accept_errors``, and every other report goes where it went."""
        previous = loop.get_exception_handler()
        if getattr(previous, "sluice_accept_errors", False):
            return  # one handler per loop (a broker's second server, say) is enough

        def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            exc = context.get("exception")
            if context.get("message") == "socket.accept() out of system resource" and isinstance(exc, OSError):
                self.accept_errors += 1
                sock = context.get("socket")
                where = "%s:%s" % sock.getsockname()[:2] if sock is not None else self.address
                self._refusals.warning("accept on %s failed (%s): not accepting for 1 s, then retrying; "
                                       "%d connections open", where, exc.strerror, len(self.connections))
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        handler.sluice_accept_errors = True  # type: ignore[attr-defined]
        loop.set_exception_handler(handler)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stop accepting, close every connection (failing their pending requests), wait for it."""
        if self._server is not None:
            self._server.close()
        if self.tls is not None:
            self.tls.close()
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.gather(self._idle_task, return_exceptions=True)
            self._idle_task = None
        conns = list(self.connections)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _new_connection(self) -> RemotingConnection:
        return RemotingConnection(dispatcher=self.dispatcher, max_frame_size=self.max_frame_size,
                                  max_inflight=self.max_inflight, on_open=self._opened, budget=self.budget)

    def _full(self, peer: str) -> bool:
        """TLS acceptor: no room for a connection from ``peer`` (those still in their handshake count too);
        the refusal is counted and logged as at ``_opened``."""
        pending = len(self.tls.pending) if self.tls is not None else 0
        if len(self.connections) + pending < self.max_connections:
            return False
        self.refused += 1
        self._refusals.warning("refusing connection from %s: %d connections open, %d in their TLS handshake "
                               "(max_connections)", peer, len(self.connections), pending)
        return True

    def _opened(self, conn: RemotingConnection) -> None:
        if len(self.connections) >= self.max_connections:
            self.refused += 1
            self._refusals.warning("refusing connection from %s: %d connections open (max_connections)",
                                   conn.peer, len(self.connections))
            conn.close_now("refused: too many connections")
            return
        self.connections.add(conn)
        conn.on_close(self._closed)
        for cb in self._open_callbacks:
            try:
                cb(conn)
            except Exception:
                log.exception("connection open callback %r failed", cb)

    async def _close_idle(self) -> None:
        """Close connections idle for ``idle_timeout`` (RocketMQ: NettyServerConfig.serverChannelMaxIdleTimeSeconds
        with an IdleStateHandler). Looks four times per timeout, so one closes within 1.25 timeouts."""
        timeout = self.idle_timeout
        tick = min(timeout / 4, 5.0)
        loop = asyncio.get_running_loop()
        quiet_since: dict[RemotingConnection, float] = {}
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            for conn in list(self.connections):
                if conn.take_activity() or conn not in quiet_since:
                    quiet_since[conn] = now
                elif now - quiet_since[conn] >= timeout:
                    self.idle_closed += 1
                    log.info("closing connection %s: idle for %g s (idle_timeout)", conn.peer, timeout)
                    conn.close_now(f"idle for {timeout:g} s")
            for conn in [c for c in quiet_since if c not in self.connections]:
                del quiet_since[conn]

    def _closed(self, conn: RemotingConnection) -> None:
        self.connections.discard(conn)
        for cb in self._close_callbacks:
            try:
                cb(conn)
            except Exception:
                log.exception("connection close callback %r failed", cb)
