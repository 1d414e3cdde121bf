"""A client connection that other threads may write requests on directly.

The blocking SDK's ``Producer.send_async`` runs on the caller's thread while
the connection lives on a loop thread. Handing each send to the loop costs a
cross-thread wake-up (a self-pipe write, an epoll return, a GIL hand-over)
before the request can leave. :meth:`ThreadWritableConnection.request_from_thread`
instead writes the frame with ``os.writev`` from the calling thread when
nothing else is waiting to be written on the connection; the response is
still read, and the waiter answered, on the loop thread.

What keeps the byte stream whole: one lock (``_wlock``) is held by every write
into the transport (the loop's ``_write`` / ``_flush``) and by a thread's whole
write; a thread writes only while the transport's own buffer is empty (so none
of the loop's bytes are still queued before ours); and what the socket did not
take of a thread's frame (``_carry``) goes out first at the loop's next flush,
before any other byte. The descriptor is forgotten under the lock before the
transport closes it (``connection_lost``) and before the connection fails its
pending waiters (``_shutdown``), so a thread never writes to a closed or reused
descriptor and never registers a waiter that nobody would fail.
"""
from __future__ import annotations

import asyncio
import os
import threading

from sluice.protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from sluice.protocol.frame import encode_frame_head
from sluice.transport.connection import RemotingConnection, ResponseWaiter

__all__ = ["ThreadWritableConnection"]

# The transport whose buffer and socket this module reasons about (asyncio's plain selector transport).
_PLAIN_TRANSPORT = "_SelectorSocketTransport"


class ThreadWritableConnection(RemotingConnection):
    """A :class:`RemotingConnection` (a client's, over a plain socket transport) that also takes
    :meth:`request_from_thread`."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        # Reentrant: _write flushes under it, and _shutdown flushes too.
        self._wlock = threading.RLock()
        #: The socket's descriptor while other threads may write to it, else -1.
        self._fd = -1
        #: What the socket did not take of a thread's frame: the next bytes on the wire (the loop writes them).
        self._carry = b""
        #: Requests written from other threads (introspection and tests).
        self.thread_writes = 0

    # ------------------------------------------------------------------------------ the loop's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if type(transport).__name__ == _PLAIN_TRANSPORT and transport.get_extra_info("sslcontext") is None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                self._fd = sock.fileno()

    def connection_lost(self, exc: Exception | None) -> None:
        with self._wlock:  # the transport closes the descriptor once this returns
            self._fd = -1
        super().connection_lost(exc)

    def _shutdown(self, reason: str) -> None:
        with self._wlock:  # no thread registers a waiter after this: the ones before are failed below
            self._fd = -1
        super()._shutdown(reason)

    def _write(self, cmd: RemotingCommand, opaque: int, flag: int, serialize_type: int) -> None:
        with self._wlock:
            super()._write(cmd, opaque, flag, serialize_type)

    def _flush(self) -> None:
        with self._wlock:
            carry = self._carry
            if carry:
                self._carry = b""
                self._wbuf.insert(0, carry)
            super()._flush()

    def _arm_from_thread(self, deadline: float) -> None:
        """A thread's request is due at ``deadline``: make sure the sweep fires by then."""
        if self._closed:
            return
        handle = self._sweep_handle
        if handle is None or handle.when() > deadline:
            self._arm_sweep(deadline)

    # ------------------------------------------------------------------------------ other threads' side

    def request_from_thread(self, cmd: RemotingCommand, timeout: float, waiter: ResponseWaiter) -> bool:
        """Write request ``cmd`` from this (non-loop) thread, its response going to ``waiter`` on the loop thread
        (as :meth:`request_with`: ``set_result``, or ``set_exception`` on timeout or close). True once written
        (bytes the socket did not take leave from the loop before anything else); False, with nothing sent or
        registered, when the connection is closed, is not a plain socket, or has bytes waiting to be written
        (its transport's buffer or this iteration's frames): then the caller goes through the loop, whose
        writes keep their order."""
        loop = self._loop
        if self._fd < 0 or loop is None:
            return False
        opaque = next(self._opaques) & 0x7FFFFFFF
        head = encode_frame_head(cmd, opaque, cmd.flag & ~(FLAG_RESPONSE | FLAG_ONEWAY), cmd.serialize_type)
        body = cmd.body
        parts = [head, body] if body else [head]
        size = len(head) + len(body)
        deadline = loop.time() + timeout
        transport = self._transport
        with self._wlock:
            fd = self._fd
            if (fd < 0 or self._wbuf or self._carry or self._write_paused or transport is None
                    or transport.get_write_buffer_size()):
                return False
            self._pending[opaque] = (waiter, deadline, cmd.code, timeout)
            try:
                sent = os.writev(fd, parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the connection is failing: the loop will see it; this request goes through it
                self._pending.pop(opaque, None)
                return False
            if sent < size:
                self._carry = b"".join(parts)[sent:]
                loop.call_soon_threadsafe(self._flush)
            self.thread_writes += 1
            arm = deadline < self._sweep_at
            if arm:  # later threads' requests see a sweep due in time; the loop arms it
                self._sweep_at = deadline
        if arm:
            loop.call_soon_threadsafe(self._arm_from_thread, deadline)
        return True
