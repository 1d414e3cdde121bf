"""TLS for the remoting transport: SSL contexts, and a server port that serves TLS, plain or both.

The modes are RocketMQ's TlsMode (remoting/src/main/java/org/apache/rocketmq/remoting/common/TlsMode.java):

* ``disabled``: plain TCP only. The server hands accepted sockets straight to RemotingConnection,
  so nothing here runs and no frame pays for TLS.
* ``permissive``: one port serves both. A connection's first byte says which it is, as in
  NettyRemotingServer.HandshakeHandler: ``0x16`` is a TLS handshake record (a plain remoting frame
  starts with its 4-byte big-endian length, and 0x16... would be a frame of over 350 MiB, far above
  any accepted size), anything else is plain.
* ``enforcing``: TLS only; a connection whose first byte is not a handshake is closed, with a
  rate-limited log line.

The first byte is *peeked* (``recv(MSG_PEEK)`` on a duplicate of the socket while the transport is
paused), so no byte is consumed: a plain connection continues on the same transport with a
RemotingConnection, a TLS one is upgraded in place with ``loop.start_tls``. Either way the codec
sees the stream from its first byte. Connections still being sniffed or shaken hands with count
toward the server's connection limit and are closed after ``handshake_timeout``.

Client side: :class:`ClientTls` (a CA file, the name to check, whether to verify) builds the
context RemotingClient connects with. Mutual TLS is an option: a server given ``client_ca`` requires
every TLS client to present a certificate that CA signed (RocketMQ's tls.server.need.client.auth =
require with tls.server.trustCertPath), and ClientTls's ``cert`` / ``key`` are the client's.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from sluice.errors import InvalidParameterError
from sluice.transport.limits import RateLimitedLog

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "TLS_HANDSHAKE_RECORD", "TLS_MODES", "ClientTls", "TlsAcceptor",
           "check_tls_mode", "server_context", "server_tls"]

log = logging.getLogger(__name__)

TLS_MODES = ("disabled", "permissive", "enforcing")
#: ContentType.handshake (RFC 8446 section 5.1): the first byte a TLS client sends.
TLS_HANDSHAKE_RECORD = 0x16
#: Seconds from accept to a finished handshake (or a first plain byte); Netty's SslHandler default is 10 s.
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


def check_tls_mode(mode: str) -> str:
    """``mode`` lower-cased if it is one of TLS_MODES; else InvalidParameterError."""
    mode = (mode or "disabled").lower()
    if mode not in TLS_MODES:
        raise InvalidParameterError(f"tls_mode must be one of {', '.join(TLS_MODES)}, got {mode!r}")
    return mode


def server_tls(mode: str, cert: str | None, key: str | None,
               client_ca: str | None = None) -> tuple[str, ssl.SSLContext | None]:
    """A server's (mode, context) from its settings: no context when disabled, else ``cert`` and ``key``
    are required (RocketMQ falls back to a self-signed certificate; a certificate no client can check
    gives no server authentication, so Sluice asks for one). ``client_ca``: require client certificates."""
    mode = check_tls_mode(mode)
    if mode == "disabled":
        if client_ca:
            raise InvalidParameterError("tls_client_ca needs tls_mode permissive or enforcing")
        return mode, None
    if not (cert and key):
        raise InvalidParameterError(f"tls_mode {mode} needs tls_cert and tls_key (PEM files)")
    return mode, server_context(cert, key, client_ca=client_ca)


def server_context(cert: str, key: str, *, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context with ``cert`` (PEM chain) and ``key``; TLS 1.2 at least. With ``client_ca``, TLS
    clients must present a certificate signed by it (mutual TLS). Bad files: InvalidParameterError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidParameterError(f"cannot use TLS certificate {cert!r} with key {key!r}: {exc}") from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidParameterError(f"cannot read TLS client CA file {client_ca!r}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True, kw_only=True)
class ClientTls:
    """How a client checks the servers it connects to over TLS."""

    #: PEM file of the CA certificates to trust; None trusts the system's store.
    ca: str | None = None
    #: The name the server's certificate must carry; None: the host of each address (an IP works
    #: when the certificate lists it as an IP subjectAltName).
    server_name: str | None = None
    #: Check the certificate chain and the name. Off only for testing: it gives up server authentication.
    verify: bool = True
    #: The client's own certificate chain and key (PEM), for servers that require one (mutual TLS).
    cert: str | None = None
    key: str | None = None
    #: ``ca`` holds the server's own certificate (its first, for a chain file), trusted as it is (OpenSSL's
    #: partial-chain flag) and not checked by name: only the holder of that certificate's key is accepted.
    #: A broker's filter-server children reach it so (broker/filter_servers.py), whatever address the
    #: certificate names.
    pinned: bool = False

    def context(self) -> ssl.SSLContext:
        if bool(self.cert) != bool(self.key):
            raise InvalidParameterError("a TLS client certificate needs both its cert and its key file")
        try:
            if self.pinned and self.ca:  # the file's first certificate only: not the intermediates after it
                ctx = ssl.create_default_context(cadata=_first_pem_certificate(self.ca))
            else:
                ctx = ssl.create_default_context(cafile=self.ca or None)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise InvalidParameterError(f"cannot read TLS CA file {self.ca!r}: {exc}") from None
        if self.cert:
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidParameterError(f"cannot use TLS client certificate {self.cert!r} with key "
                                            f"{self.key!r}: {exc}") from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.pinned:
            if not self.ca:
                raise InvalidParameterError("a pinned TLS certificate needs its file as the CA file")
            ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            ctx.check_hostname = False
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def _first_pem_certificate(path: str) -> str:
    """The first PEM certificate block of ``path`` (a chain file starts with its leaf)."""
    with open(path, encoding="ascii", errors="replace") as f:
        text = f.read()
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("no PEM certificate in it")
    return text[start:stop + len(end)] + "\n"


class _Early(asyncio.Protocol):
    """The app protocol during ``start_tls``: keeps what arrives before the RemotingConnection takes over."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class TlsAcceptor:
    """The server's protocol factory in permissive and enforcing modes: sniffs, then plain or TLS.

    ``new_connection()`` makes the RemotingConnection a sniffed connection becomes; ``full(peer)`` says
    the server has no room for one more (it counts and logs that refusal; the sniffer then closes at once)."""

    def __init__(self, mode: str, context: ssl.SSLContext, new_connection: Callable[[], asyncio.BufferedProtocol],
                 full: Callable[[str], bool], handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT) -> None:
        if mode not in ("permissive", "enforcing"):
            raise InvalidParameterError(f"a TLS acceptor runs in permissive or enforcing mode, not {mode!r}")
        self.mode = mode
        self.context = context
        self.new_connection = new_connection
        self.full = full
        self.handshake_timeout = handshake_timeout
        #: Connections being sniffed or shaken hands with.
        self.pending: set[_Sniffer] = set()
        #: Counters, for logs and tests: plain connections refused (enforcing), failed or timed-out
        #: handshakes, connections that went on plain, and over TLS.
        self.plain_refused = 0
        self.handshake_failed = 0
        self.plain = 0
        self.tls = 0
        self.refusal_log = RateLimitedLog(log)
        self.failure_log = RateLimitedLog(log)

    def protocol(self) -> asyncio.Protocol:
        return _Sniffer(self)

    def close(self) -> None:
        """Close every connection not handed over yet (the server is closing)."""
        for sniffer in list(self.pending):
            sniffer.abandon("server closing")


class _Sniffer(asyncio.Protocol):
    """A server connection until its first byte is known (then until its TLS handshake is done)."""

    def __init__(self, acceptor: TlsAcceptor) -> None:
        self._acceptor = acceptor
        self._transport: asyncio.Transport | None = None
        self._peek: socket.socket | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.pause_reading()  # before the transport's first read: the bytes stay in the kernel
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        acc = self._acceptor
        if acc.full(self.peer):
            transport.close()
            return
        self._loop = loop = asyncio.get_running_loop()
        try:
            self._peek = transport.get_extra_info("socket").dup()
            loop.add_reader(self._peek.fileno(), self._readable)
        except (OSError, AttributeError, RuntimeError, NotImplementedError) as exc:
            log.warning("cannot look at the first byte from %s (%s): closing", self.peer, exc)
            self._stop_peeking()
            transport.close()
            return
        acc.pending.add(self)
        self._timer = loop.call_later(acc.handshake_timeout, self._expire)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _readable(self) -> None:
        assert self._peek is not None and self._transport is not None
        try:
            first = self._peek.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            first = b""
        self._stop_peeking()
        acc = self._acceptor
        transport = self._transport
        if not first:  # closed before saying anything
            self._finish()
            transport.close()
        elif first[0] == TLS_HANDSHAKE_RECORD:
            self._task = self._loop.create_task(self._upgrade())  # type: ignore[union-attr]
        elif acc.mode == "enforcing":
            acc.plain_refused += 1
            acc.refusal_log.warning("refusing plain (non-TLS) connection from %s: tls_mode is enforcing", self.peer)
            self._finish()
            transport.close()
        else:
            acc.plain += 1
            self._finish()
            conn = acc.new_connection()
            transport.set_protocol(conn)
            conn.connection_made(transport)
            transport.resume_reading()

    async def _upgrade(self) -> None:
        acc = self._acceptor
        early = _Early()
        transport = self._transport
        assert transport is not None and self._loop is not None
        try:
            app = await self._loop.start_tls(transport, early, acc.context, server_side=True,
                                             ssl_handshake_timeout=acc.handshake_timeout)
        except asyncio.CancelledError:  # timed out (see _expire) or the server closes; start_tls closed it
            self._finish()
            return
        except Exception as exc:  # whatever the peer sent: its connection fails alone
            acc.handshake_failed += 1
            acc.failure_log.warning("TLS handshake with %s failed: %s", self.peer, _handshake_failure(exc))
            self._finish()
            transport.close()
            return
        self._finish()
        if early.lost:
            return
        acc.tls += 1
        conn = acc.new_connection()
        app.set_protocol(conn)
        conn.connection_made(app)
        if early.data:
            conn.data_received(bytes(early.data))
        if early.eof:
            conn.eof_received()

    def _expire(self) -> None:
        self._timer = None
        if self not in self._acceptor.pending:
            return
        acc = self._acceptor
        acc.handshake_failed += 1
        acc.failure_log.warning("closing connection %s: no %s within %g s", self.peer,
                                "TLS handshake" if self._task else "first byte", acc.handshake_timeout)
        self.abandon("handshake timeout")

    def abandon(self, reason: str) -> None:
        log.debug("closing connection %s before hand-over: %s", self.peer, reason)
        task = self._task
        self._stop_peeking()
        self._finish()
        if task is not None and not task.done():
            task.cancel()  # start_tls closes the transport when cancelled
        elif self._transport is not None:
            self._transport.close()

    def _stop_peeking(self) -> None:
        peek, self._peek = self._peek, None
        if peek is not None:
            if self._loop is not None:
                self._loop.remove_reader(peek.fileno())
            peek.close()

    def _finish(self) -> None:
        """No longer pending: handed over, refused or closed."""
        self._stop_peeking()
        self._acceptor.pending.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _handshake_failure(exc: BaseException) -> str:
    """Why a server-side handshake failed, never an empty string: a client that rejects the server's certificate
    just closes the connection, which reaches the server as a bare ConnectionResetError()."""
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return ("the client closed the connection during the handshake (does it trust this server's certificate "
                "and its names? check the client's CA file and server name)")
    return str(exc) or type(exc).__name__
