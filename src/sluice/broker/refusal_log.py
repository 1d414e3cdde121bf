"""Log lines for refused requests, rate-limited per client and reason (as ``sluice.acl.guard.AclGuard`` does).

A client that keeps sending the same bad request gets its precise error every time, but the broker's log
gets one line per (client host, reason) a minute, then one that says how many were left out. The reason
is the error's class and its message with the numbers blanked, so a client cycling through bad values
of one field is one reason, not thousands. The host, not host:port, is the client: reconnecting does
not open a new allowance.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

__all__ = ["REFUSAL_LOG_INTERVAL", "RefusalLog"]

#: One line per client and reason per this many seconds.
REFUSAL_LOG_INTERVAL = 60.0
#: (client, reason) pairs remembered for the limit; past it the memory starts over (bounded, never grows).
_MAX_REMEMBERED = 10_000
_NUMBER = re.compile(r"-?\d+")


class RefusalLog:
    def __init__(self, logger: logging.Logger, what: str, *, interval: float = REFUSAL_LOG_INTERVAL,
                 max_remembered: int = _MAX_REMEMBERED, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what  # "send", ...: the line reads "<what> from <host> refused: <error>"
        self._interval = interval
        self._max = max_remembered
        self._clock = clock
        #: (host, reason) -> [time of the last line, refusals not logged since]
        self._seen: dict[tuple[str, str], list[float]] = {}

    @staticmethod
    def reason(exc: BaseException) -> str:
        return f"{type(exc).__name__}:{_NUMBER.sub('#', str(exc))}"

    def refused(self, peer: str, exc: BaseException) -> bool:
        """Note that ``peer`` (host:port) was refused with ``exc``; True when a line was logged."""
        host = peer.rpartition(":")[0] or peer
        key = (host, self.reason(exc))
        now = self._clock()
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self._interval:
            entry[1] += 1
            return False
        skipped = int(entry[1]) if entry is not None else 0
        if entry is None and len(self._seen) >= self._max:
            self._seen.clear()
        self._seen[key] = [now, 0]
        if skipped:
            self._log.warning("%s from %s refused: %s (%d more like it from this client not logged in the "
                              "last %g s)", self._what, host, exc, skipped, self._interval)
        else:
            self._log.warning("%s from %s refused: %s", self._what, host, exc)
        return True
