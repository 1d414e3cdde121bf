"""One remoting connection, an ``asyncio.Protocol`` used the same way by servers and clients.

Either side may send requests on it: a request gets an opaque from this
connection's counter and a Future in ``_pending``; ``data_received`` resolves it
when a response with that opaque arrives (responses may come in any order).
Requests from the peer are handed to the :class:`Dispatcher`'s handler: a plain
function is answered at once, an ``async def`` one (or a plain function that
returns an awaitable) runs in its own task, so a slow handler (a long-polling
pull) never blocks the connection.

The hot path is built for CPU per request, not elegance: frames written during
one event-loop iteration leave in one ``transport.write`` (collected in
``_wbuf``; the first write of an iteration schedules one flush with
``call_soon``, later ones only append; what the handlers of one read write, on
any connection, leaves at the end of ``data_received`` (a write batch, transport/batching.py), and
64 KiB waiting are written at once; work a request queues with ``after_read``
runs right after, still in that iteration), commands are
encoded with the opaque/flag they are sent with instead of being copied, and
reads are decoded straight from the bytes the transport hands over.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sluice.errors import ProtocolError, RemotingError, RemotingTimeoutError, SluiceError
from sluice.protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE, NEED_DATA, FrameCodec, encode_frame_head
from sluice.transport.batching import current_batch, handle_read
from sluice.transport.dispatcher import Dispatcher, RequestHandler, split_addr
from sluice.ratelog import RateLimitedLog
from sluice.transport.limits import SMALL_FRAME, FrameBudget

__all__ = ["DEFAULT_MAX_INFLIGHT", "CloseCallback", "Dispatcher", "RemotingConnection", "RequestHandler", "ResponseWaiter",
           "split_addr"]

log = logging.getLogger(__name__)

CloseCallback = Callable[["RemotingConnection"], None]


class ResponseWaiter(Protocol):
    """What :meth:`RemotingConnection.request_with` hands a response to (an asyncio.Future has this shape)."""

    def done(self) -> bool: ...

    def set_result(self, response: RemotingCommand, /) -> None: ...

    def set_exception(self, exc: BaseException, /) -> None: ...

#: Requests from the peer being handled at once on one connection; beyond it we stop reading (backpressure).
DEFAULT_MAX_INFLIGHT = 4096
# Collected output is written at once past this many bytes (else at the end of the loop iteration).
_FLUSH_AT = 64 * 1024
# A body this big is handed to the transport as is, after what was collected before it, rather than
# copied into one joined write. Smaller ones are joined: the copy costs less CPU than a second write
# (and its wake-up on the reading side) would.
_BIG_BODY = 1024 * 1024
_CLOSE_TIMEOUT = 10.0
_READ_BUFFER = 256 * 1024  # what one read may take (asyncio's own read size)
_reads = threading.local()  # close(): abort a transport whose peer will not take our last bytes
_NEVER = float("inf")
# A peer that reconnects in a loop with bad frames must not flood the log.
_protocol_errors = RateLimitedLog(log)


class RemotingConnection(asyncio.BufferedProtocol):
    """A framed connection: ``request``/``send_oneway`` out, dispatch in.

    It is the transport's protocol: ``loop.create_server(lambda: RemotingConnection(...), ...)``
    or ``loop.create_connection(...)`` (RemotingServer and RemotingClient do this).
    ``on_open(conn)`` runs when the transport is attached.
    """

    def __init__(
        self, *, dispatcher: Dispatcher | None = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_inflight: int = DEFAULT_MAX_INFLIGHT, on_open: CloseCallback | None = None,
        budget: FrameBudget | None = None,
    ) -> None:
        self._dispatcher = dispatcher or _NO_HANDLERS
        self._table = self._dispatcher._table
        self._max_inflight = max_inflight
        self._on_open = on_open
        self._codec = FrameCodec(max_frame_size)
        self._opaques = itertools.count(1)
        # opaque -> (future, deadline, request code, timeout) of our requests awaiting their response
        self._pending: dict[int, tuple[ResponseWaiter, float, int, float | None]] = {}
        self._sweep_at = _NEVER
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}  # handler tasks by a private key
        self._task_keys = itertools.count()
        # Tasks (by key) for awaitables returned by plain handlers that have not started yet. Such a
        # handler has already begun (it may have counted the request, say), so a close does not cancel
        # these before they run: they start, and are cancelled at their first wait (see _serve).
        self._unstarted: set[int] = set()
        self._close_callbacks: list[CloseCallback] = []
        self._closed = False
        self._closed_event = asyncio.Event()
        self._lost: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._transport_open = False  # from connection_made to connection_lost
        self._loop: asyncio.AbstractEventLoop | None = None
        # write side: frames collected until the end of the loop iteration
        self._wbuf: list[bytes] = []
        self._wlen = 0
        self._flush_scheduled = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # read side: requests are held (and reading paused) while too many run or our output is stuck
        self._blocked = False
        self._held: deque[RemotingCommand] = deque()
        self._reading_paused = False
        # frame budget (servers only, transport/limits.py): bytes reserved for the big frame being received,
        # and whether reading is paused until the budget grants them
        self._budget = budget
        self._reserved = 0
        self._budget_wait = False
        # idle timeout: a frame arrived or a handler answered since the server last looked (take_activity)
        self._active = True
        #: Requests the owner answers later itself (its handler returned None): while above 0 the
        #: connection is not idle, as with a request whose handler task is still running.
        self.busy = 0
        self.peer = "?"
        #: Free for the owner's per-connection state (e.g. the broker's client id).
        self.attributes: dict[str, Any] = {}

    # -------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Kept for callers of the stream-based version: reading starts when the transport attaches."""

    @property
    def is_closed(self) -> bool:
        return self._closed

    def on_close(self, callback: CloseCallback) -> None:
        """Call ``callback(conn)`` once when the connection closes (at once if it already has)."""
        if self._closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    def close_now(self, reason: str) -> None:
        """Close without waiting (what handlers already answered still goes out); ``reason`` is logged at debug."""
        self._shutdown(reason)

    async def close(self) -> None:
        """Close (sending what is collected first) and wait until the transport is gone."""
        self._shutdown("closed locally")
        lost = self._lost
        if lost is None or lost.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(lost), _CLOSE_TIMEOUT)
        except TimeoutError:  # the peer does not take what we still had to send
            self._transport.abort()  # type: ignore[union-attr]

    # -------------------------------------------------------------------------------- sending

    async def request(self, cmd: RemotingCommand, timeout: float | None) -> RemotingCommand:
        """Send a request and wait for its response (any code; see ``RemotingCommand.raise_for_code``)."""
        opaque, fut = self._register(cmd, timeout)
        try:
            self._write(cmd, opaque, cmd.flag & ~(FLAG_RESPONSE | FLAG_ONEWAY), cmd.serialize_type)
            if self._write_paused:
                await self._writable(fut)
            return await fut
        finally:
            self._pending.pop(opaque, None)

    def _register(self, cmd: RemotingCommand, timeout: float | None) -> tuple[int, asyncio.Future[RemotingCommand]]:
        """A fresh opaque and the future its response resolves; ``timeout`` None waits for ever."""
        if self._closed:
            raise RemotingError(f"connection to {self.peer} is closed")
        opaque = next(self._opaques) & 0x7FFFFFFF
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        deadline = loop.time() + timeout if timeout is not None else _NEVER
        self._pending[opaque] = (fut, deadline, cmd.code, timeout)
        if deadline < self._sweep_at:
            self._arm_sweep(deadline)
        return opaque, fut

    def request_nowait(self, cmd: RemotingCommand, timeout: float | None) -> asyncio.Future[RemotingCommand]:
        """Send a request now and return the future of its response, without waiting for it.

        The frame leaves before this returns (no loop iteration later), so a caller can send its next
        pull and then work on the last answer while the peer prepares the next one, as RocketMQ's pull
        service does. Timeouts and a closing connection fail the future as they fail :meth:`request`.
        The caller must not write faster than the peer reads: this does not wait while the transport's
        buffer is full (use :meth:`request` for that)."""
        opaque, fut = self._register(cmd, timeout)
        self._write(cmd, opaque, cmd.flag & ~(FLAG_RESPONSE | FLAG_ONEWAY), cmd.serialize_type)
        self._flush()
        return fut

    def request_with(self, cmd: RemotingCommand, timeout: float | None, waiter: ResponseWaiter) -> int:
        """Send a request whose response goes to ``waiter`` (no task, no future): ``set_result(response)`` as the
        frame is decoded, or ``set_exception(exc)`` on timeout or close, once, while ``waiter.done()`` is false
        (the SDK's SendCall). Returns the opaque (for :meth:`forget`). The frame leaves with this iteration's
        writes; this does not wait while the transport's buffer is full (check :attr:`writable` first)."""
        if self._closed:
            raise RemotingError(f"connection to {self.peer} is closed")
        opaque = next(self._opaques) & 0x7FFFFFFF
        deadline = self._loop.time() + timeout if timeout is not None else _NEVER  # type: ignore[union-attr]
        self._pending[opaque] = (waiter, deadline, cmd.code, timeout)
        if deadline < self._sweep_at:
            self._arm_sweep(deadline)
        self._write(cmd, opaque, cmd.flag & ~(FLAG_RESPONSE | FLAG_ONEWAY), cmd.serialize_type)
        return opaque

    def forget(self, opaque: int) -> None:
        """Drop a request's waiter (its sender gave up); a late response is then dropped as unknown."""
        self._pending.pop(opaque, None)

    @property
    def writable(self) -> bool:
        """Open, and the transport takes writes (its buffer is under the high-water mark)."""
        return not self._closed and not self._write_paused

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        if self._closed:
            raise RemotingError(f"connection to {self.peer} is closed")
        opaque = next(self._opaques) & 0x7FFFFFFF
        self._write(cmd, opaque, (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE, cmd.serialize_type)
        if self._write_paused:
            await self._writable()

    async def send(self, cmd: RemotingCommand) -> None:
        """Write one command as is (a response must carry its request's opaque).

        Returns once the frame is queued, waiting first while the peer is not
        reading (the transport's buffer is over its high-water mark)."""
        if self._closed:
            raise RemotingError(f"connection to {self.peer} is closed")
        self._write(cmd, cmd.opaque, cmd.flag, cmd.serialize_type)
        if self._write_paused:
            await self._writable()

    # Timeouts: rather than a loop timer per request (a TimerHandle, and heap pushes and pops whose
    # comparisons run in Python, per request), one timer per connection fires at the earliest
    # deadline of its pending requests, fails those that are due and re-arms for the next one.
    def _arm_sweep(self, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = self._loop.call_at(when, self._sweep)  # type: ignore[union-attr]

    def _sweep(self) -> None:
        self._sweep_handle, self._sweep_at = None, _NEVER
        now = self._loop.time()  # type: ignore[union-attr]
        next_at = _NEVER
        due = []
        # A snapshot: another thread may add a request meanwhile (transport/thread_writes.py).
        for opaque, entry in list(self._pending.items()):
            if entry[1] <= now:
                due.append(opaque)
            elif entry[1] < next_at:
                next_at = entry[1]
        for opaque in due:
            entry = self._pending.pop(opaque, None)  # a waiter failed before may have forgotten another
            if entry is None:
                continue
            fut, _, code, timeout = entry
            if not fut.done():
                fut.set_exception(RemotingTimeoutError(
                    f"no response to request code {code} from {self.peer} within {timeout:g} s"))
        # A waiter failed above may have sent its retry on this connection and armed the sweep already.
        if next_at < self._sweep_at:
            self._arm_sweep(next_at)

    def _write(self, cmd: RemotingCommand, opaque: int, flag: int, serialize_type: int) -> None:
        # Encoding with the given opaque/flag/serialize type instead of a dataclasses.replace copy.
        head = encode_frame_head(cmd, opaque, flag, serialize_type)
        body = cmd.body
        wbuf = self._wbuf
        wbuf.append(head)
        if body:
            if len(body) >= _BIG_BODY:  # a big body goes to the transport as is, after what precedes it
                self._flush()
                if self._transport_open:
                    self._transport.write(body)  # type: ignore[union-attr]
                return
            wbuf.append(body)
            self._wlen += len(head) + len(body)
        else:
            self._wlen += len(head)
        if self._wlen >= _FLUSH_AT:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            batch = current_batch()
            if batch is None:
                self._loop.call_soon(self._flush)  # type: ignore[union-attr]
            else:
                batch.append(self)

    def _flush(self) -> None:
        self._flush_scheduled = False
        wbuf = self._wbuf
        if not wbuf:
            return
        data = wbuf[0] if len(wbuf) == 1 else b"".join(wbuf)
        wbuf.clear()
        self._wlen = 0
        if self._transport_open:
            self._transport.write(data)  # type: ignore[union-attr]

    async def _writable(self, fut: asyncio.Future[RemotingCommand] | None = None) -> None:
        """Wait until the transport takes writes again (like StreamWriter.drain); ``fut`` done ends it early."""
        waiter: asyncio.Future[None] = self._loop.create_future()  # type: ignore[union-attr]
        self._drain_waiters.append(waiter)
        if fut is not None:  # a request's timeout also bounds its wait to be written
            fut.add_done_callback(lambda _f: waiter.done() or waiter.set_result(None))
        try:
            await waiter
        finally:
            if waiter in self._drain_waiters:
                self._drain_waiters.remove(waiter)
        if self._closed and (fut is None or not fut.done()):
            raise RemotingError(f"connection to {self.peer} closed while writing")

    # -------------------------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._transport_open = True
        self._loop = loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._on_open is not None:
            self._on_open(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport_open = False
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        self._shutdown(f"connection error: {exc}" if exc else "closed by peer")

    def pause_writing(self) -> None:
        self._write_paused = True
        self._blocked = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writers()
        if self._blocked:
            self._loop.call_soon(self._unblock)  # type: ignore[union-attr]

    # The transport reads into one buffer of ours (BufferedProtocol) instead of allocating a fresh 256 KiB
    # bytes per read: an allocation that size is an mmap, mremap and munmap (with page faults and TLB
    # shoot-downs) per read, which for 37 KB pull responses cost more than the copy made here.
    # The buffer is the thread's (one loop per thread): the transport fills it and calls buffer_updated
    # at once, which copies the bytes out, so connections need not each keep 256 KiB.
    def get_buffer(self, sizehint: int) -> memoryview:
        view = getattr(_reads, "view", None)
        if view is None:
            view = _reads.view = memoryview(bytearray(_READ_BUFFER))
        return view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(_reads.view[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        # One write batch per read, then the work queued with after_read(), still in this loop iteration
        # (transport/batching.py).
        handle_read(self._receive, data)

    def _receive(self, data: bytes) -> None:
        codec = self._codec
        pending = self._pending
        got = False
        try:
            codec.receive_data(data)
            while (frame := codec.next_frame()) is not NEED_DATA:
                got = True
                if frame.flag & 1:  # FLAG_RESPONSE  # type: ignore[union-attr]
                    entry = pending.pop(frame.opaque, None)  # type: ignore[union-attr]
                    if entry is not None and not entry[0].done():
                        entry[0].set_result(frame)  # type: ignore[arg-type]
                    else:
                        log.debug("response with unknown opaque %d from %s dropped (timed out?)",
                                  frame.opaque, self.peer)  # type: ignore[union-attr]
                elif self._blocked:
                    self._hold(frame)  # type: ignore[arg-type]
                else:
                    self._dispatch(frame)  # type: ignore[arg-type]
                if self._closed:
                    return
        except ProtocolError as exc:  # the stream cannot be resynchronised
            _protocol_errors.warning("closing connection %s: %s", self.peer, exc)
            self._shutdown(f"protocol error: {exc}")
            return
        if got:
            self._active = True
        if self._budget is not None and (self._reserved or codec.buffered):
            self._account(got)
        if self._wbuf:  # answers of plain handlers leave now, in one write, not one loop iteration later
            self._flush()

    def _account(self, got: bool) -> None:
        """Reserve budget for a big frame being received, or pause reading until it can (transport/limits.py)."""
        budget = self._budget
        assert budget is not None
        if self._reserved:
            if not got:
                return  # the reserved frame is still coming
            self._reserved = 0  # it completed: its bytes went to the handler
            budget.release(self)
        if self._budget_wait:
            return
        size = self._codec.partial_frame_size
        if size <= SMALL_FRAME:
            return
        if budget.reserve(self, size):
            self._reserved = size
            return
        self._budget_wait = True
        log.debug("connection %s waits for %d bytes of frame budget (%d of %d reserved)",
                  self.peer, size, budget.reserved, budget.limit)
        if self._transport is not None:
            self._transport.pause_reading()

    def budget_granted(self) -> None:
        """The budget reserved our frame: read on (unless requests are held for another reason)."""
        self._reserved = self._budget.holding(self)  # type: ignore[union-attr]
        self._budget_wait = False
        if not self._reading_paused and self._transport_open and not self._closed:
            self._transport.resume_reading()  # type: ignore[union-attr]

    def take_activity(self) -> bool:
        """Whether the peer was active since the last call: a frame arrived, a handler answered, or a request
        either side sent is still being served. Clears the mark (the server's idle check calls this)."""
        active = self._active or bool(self._tasks or self._held or self._pending) or self.busy > 0
        self._active = False
        return active

    def eof_received(self) -> bool | None:
        self.data_received(b"")  # a frame cut short is a protocol error
        self._shutdown("closed by peer")
        return None

    # -------------------------------------------------------------------------------- serving requests

    def _dispatch(self, request: RemotingCommand) -> None:
        entry = self._table.get(request.code)
        if entry is None:
            self._answer(request, self._dispatcher.unsupported(self, request))
            return
        handler, is_async = entry
        if is_async:  # called inside its task, as it always was
            self._spawn(request, handler, None)
            return
        try:
            response = handler(self, request)
        except Exception as exc:
            response = self._dispatcher.error_response(self, request, exc)
        else:
            if response is None:
                return
            if type(response) is not RemotingCommand and not isinstance(response, RemotingCommand):
                self._spawn(request, None, response)
                return
        # _answer, inlined for the plain-handler path
        if request.flag & FLAG_ONEWAY or self._closed:
            return
        try:
            self._write(response, request.opaque, response.flag | FLAG_RESPONSE, request.serialize_type)
        except SluiceError as exc:  # a response that cannot be encoded
            log.error("could not answer request code %d from %s: %s", request.code, self.peer, exc)

    def _spawn(self, request: RemotingCommand, handler: RequestHandler | None,
               awaitable: Awaitable[RemotingCommand | None] | None) -> None:
        key = next(self._task_keys)
        tasks = self._tasks
        tasks[key] = self._loop.create_task(self._serve(key, request, handler, awaitable))  # type: ignore[union-attr]
        if awaitable is not None:
            self._unstarted.add(key)
        if len(tasks) >= self._max_inflight:
            self._blocked = True

    async def _serve(self, key: int, request: RemotingCommand, handler: RequestHandler | None,
                     awaitable: Awaitable[RemotingCommand | None] | None) -> None:
        try:
            try:
                if awaitable is None:
                    response = await handler(self, request)  # type: ignore[misc]
                else:
                    self._unstarted.discard(key)
                    if self._closed:  # closed before we ran: cancel the awaitable at its first wait
                        self._loop.call_soon(asyncio.current_task().cancel)  # type: ignore[union-attr]
                    response = await awaitable
            except Exception as exc:
                response = self._dispatcher.error_response(self, request, exc)
            self._answer(request, response)
        finally:
            self._tasks.pop(key, None)
            self._active = True
            if self._blocked and not self._closed:
                self._loop.call_soon(self._unblock)  # type: ignore[union-attr]

    def answer(self, request: RemotingCommand, response: RemotingCommand | Exception) -> None:
        """Answer a request outside its handler, whose result was None (a sync-flush send's reply from its fsync
        round, a held pull's callback): ``response``, or the error reply for the exception a handler would
        have raised. The caller keeps the request counted in :attr:`busy` meanwhile if it must. Written
        with the other frames of this loop iteration (or of the open write batch, :func:`begin_writes`);
        nothing when the request is oneway or the connection closed meanwhile."""
        if not isinstance(response, RemotingCommand):
            response = self._dispatcher.error_response(self, request, response)
        self._active = True
        self._answer(request, response)

    def _answer(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        if response is None or request.flag & FLAG_ONEWAY or self._closed:
            return
        try:
            self._write(response, request.opaque, response.flag | FLAG_RESPONSE, request.serialize_type)
        except SluiceError as exc:  # a response that cannot be encoded
            log.error("could not answer request code %d from %s: %s", request.code, self.peer, exc)

    def _hold(self, request: RemotingCommand) -> None:
        """Keep a request until we may serve it again, and stop reading: the rest waits in TCP buffers."""
        self._held.append(request)
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _unblock(self) -> None:
        if self._closed or not self._blocked:
            return
        held = self._held
        limit = self._max_inflight
        while not self._write_paused and len(self._tasks) < limit:
            if not held:
                self._blocked = False
                if self._reading_paused:
                    self._reading_paused = False
                    if not self._budget_wait:
                        self._transport.resume_reading()  # type: ignore[union-attr]
                return
            self._dispatch(held.popleft())
            if self._closed:
                return

    # -------------------------------------------------------------------------------- closing

    def _wake_writers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _shutdown(self, reason: str) -> None:
        if self._closed:
            return
        if self._transport_open:
            self._flush()  # what handlers already answered still goes out
            self._transport.close()  # type: ignore[union-attr]
        self._closed = True
        self._closed_event.set()
        log.debug("connection %s closed: %s", self.peer, reason)
        self._held.clear()
        self._wbuf.clear()
        if self._budget is not None:
            self._reserved = 0
            self._budget.release(self)
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        pending, self._pending = self._pending, {}
        for fut, *_ in pending.values():
            if not fut.done():
                fut.set_exception(RemotingError(f"connection to {self.peer} closed ({reason})"))
        current = asyncio.current_task() if self._loop is not None and self._loop.is_running() else None
        unstarted = self._unstarted
        for key, task in list(self._tasks.items()):
            if task is not current and key not in unstarted:
                task.cancel()
        self._wake_writers()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("connection close callback %r failed", cb)


_NO_HANDLERS = Dispatcher()
