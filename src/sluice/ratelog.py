"""One log line per interval for one cause, however often the cause recurs.

Servers meet some failures in floods (a peer reconnecting in a loop with bad
frames, a full disk met by every write, refused TLS handshakes); logging each
would bury everything else. The line after a quiet spell says how many were
left out.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """Logs at most one line per ``interval`` seconds, counting the lines left out meanwhile.

    Safe to share between threads (the store's maintenance and dispatch threads use one).
    """

    def __init__(self, logger: logging.Logger, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock
        self._next = float("-inf")
        self._skipped = 0
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            if now < self._next:
                self._skipped += 1
                return
            skipped, self._skipped = self._skipped, 0
            self._next = now + self._interval
        if skipped:
            msg += f" ({skipped} more like it not logged in the last {self._interval:g} s)"
        self._log.log(level, msg, *args)

    __call__ = log

    def warning(self, msg: str, *args: object) -> None:
        self.log(logging.WARNING, msg, *args)
