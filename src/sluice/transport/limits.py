"""A server's bounds on its connections: memory for frames being received, and rate-limited logging.

**Frame budget.** A frame being received is held in memory until its last byte arrives, so a peer
that sends the head of a 16 MiB frame and stops holds 16 MiB. Frames up to :data:`SMALL_FRAME`
need nothing (their bytes per connection are bounded by that size and one read); a bigger one
must *reserve* its declared size from the server-wide :class:`FrameBudget` before more of it is
read. A connection whose frame does not fit stops reading (``transport.pause_reading``; the rest
waits in the kernel's buffers and the peer's) until reservations free, first come first served.
A reserved frame is never paused, so reserved frames always finish and free their share: peers
sending big frames at once are served a budget's worth at a time, never deadlock. Pausing was
chosen over closing a holder: closing lets an attacker's new frame evict a normal client's big
send, while pausing costs normal clients only small frames' worth of nothing (they are never
paused) and big sends some waiting; a peer that holds a reservation and stops sending is closed
by the idle timeout (no complete frame for that long), which frees its share.
"""
from __future__ import annotations

from collections import deque
from typing import Protocol

from sluice.ratelog import RateLimitedLog

__all__ = ["DEFAULT_FRAME_BUDGET", "DEFAULT_IDLE_TIMEOUT", "DEFAULT_MAX_CONNECTIONS", "SMALL_FRAME",
           "FrameBudget", "RateLimitedLog"]

#: Bytes of frames being received over all connections of a server (four 16 MiB frames at once).
DEFAULT_FRAME_BUDGET = 64 * 1024 * 1024
#: Frames up to this size (length prefix included) are received without a reservation.
SMALL_FRAME = 256 * 1024
#: Connections a server keeps at once; more are closed at accept.
DEFAULT_MAX_CONNECTIONS = 4096
#: RocketMQ closes channels idle this long (NettyServerConfig.serverChannelMaxIdleTimeSeconds: 120).
DEFAULT_IDLE_TIMEOUT = 120.0


class BudgetHolder(Protocol):
    def budget_granted(self) -> None: ...


class FrameBudget:
    """Reservations of bytes for big frames being received; waiters are served in arrival order."""

    def __init__(self, limit: int = DEFAULT_FRAME_BUDGET) -> None:
        if limit < 1:
            raise ValueError(f"frame budget {limit} must be positive")
        self.limit = limit
        self.reserved = 0
        self._held: dict[BudgetHolder, int] = {}
        self._waiting: deque[tuple[BudgetHolder, int]] = deque()
        #: Connections made to wait so far (for logs and tests).
        self.waits = 0

    def holding(self, holder: BudgetHolder) -> int:
        return self._held.get(holder, 0)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def reserve(self, holder: BudgetHolder, size: int) -> bool:
        """Reserve ``size`` bytes for ``holder``'s frame; False queues it (``budget_granted`` is called later).

        A frame bigger than the whole budget is admitted when nothing else is reserved."""
        if not self._waiting and (self.reserved + size <= self.limit or not self.reserved):
            self._held[holder] = size
            self.reserved += size
            return True
        self._waiting.append((holder, size))
        self.waits += 1
        return False

    def release(self, holder: BudgetHolder) -> None:
        """Give back ``holder``'s reservation (its frame completed or it closed) and drop it from the queue."""
        size = self._held.pop(holder, 0)
        if any(h is holder for h, _ in self._waiting):
            self._waiting = deque(w for w in self._waiting if w[0] is not holder)
        if size:
            self.reserved -= size
        self._grant()

    def _grant(self) -> None:
        waiting = self._waiting
        while waiting:
            holder, size = waiting[0]
            if self.reserved + size > self.limit and self.reserved:
                return
            waiting.popleft()
            self._held[holder] = size
            self.reserved += size
            holder.budget_granted()
