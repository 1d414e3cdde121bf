"""The disk guard: refuse writes while the store's disk is too full, and after ENOSPC, with back-off.

RocketMQ's CleanCommitLogService (store/src/main/java/org/apache/rocketmq/store/DefaultMessageStore.java)
samples the commit log's partition on a timer and flips ``runningFlags`` to disk-full; ``putMessage`` then
answers SERVICE_NOT_AVAILABLE while reads go on. Sluice does the same: ``statvfs`` runs on the store's
maintenance timer (never per message), and a put reads one attribute (:attr:`DiskGuard.refusal`).

Two limits, either one refuses: the used-space ratio (RocketMQ's ``diskMaxUsedSpaceRatio``, used =
total - free over total as Java's File.getFreeSpace counts) and a floor of free bytes (``f_bavail``, what
this process may still allocate). An allocation that fails with ENOSPC (:meth:`DiskGuard.space_error`)
refuses writes too, until a later sample finds room again and a back-off (1 s doubling to 30 s) has passed,
so a disk that keeps filling is not retried on every send.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import DiskFullError
from sluice.ratelog import RateLimitedLog

__all__ = ["DiskGuard", "DiskUsage", "disk_usage"]

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class DiskUsage:
    total: int
    free: int  # f_bfree: what Java's getFreeSpace reports (the ratio is computed from it)
    available: int  # f_bavail: what this process may allocate (the floor is checked against it)

    @property
    def used_ratio(self) -> float:
        return (self.total - self.free) / self.total if self.total else 1.0


def disk_usage(path: str | os.PathLike[str]) -> DiskUsage:
    st = os.statvfs(path)
    return DiskUsage(st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize, st.f_bavail * st.f_frsize)


class DiskGuard:
    """Whether the store may write: sampled on a timer, set at once by an allocation that met ENOSPC."""

    def __init__(self, path: Path, *, max_used_ratio: int, min_free_bytes: int) -> None:
        self.path = path
        self.max_used_ratio = max_used_ratio  # percent, as RocketMQ's diskMaxUsedSpaceRatio
        self.min_free_bytes = min_free_bytes
        #: None while writes are allowed; else the remark a refused put carries.
        self.refusal: str | None = None
        self.last_usage: DiskUsage | None = None
        self.refused_puts = 0
        self._space_error_at = 0.0
        self._backoff = 0.0
        self._log = RateLimitedLog(log, 30.0)

    def check(self) -> str | None:
        """Sample the disk (the timer calls this); return and remember the refusal, or None."""
        try:
            u = disk_usage(self.path)
        except OSError as e:
            self._log(logging.ERROR, "disk check of %s failed: %s", self.path, e)
            return self.refusal
        self.last_usage = u
        reason = None
        ratio = u.used_ratio * 100
        if ratio > self.max_used_ratio or u.available < self.min_free_bytes:
            reason = (f"service not available now, maybe disk full: the broker's disk is full [CL: {u.used_ratio:.2f}]: "
                      f"{self.path} is {ratio:.1f}% used (diskMaxUsedSpaceRatio {self.max_used_ratio}%), "
                      f"{u.available} bytes free (disk_min_free_bytes {self.min_free_bytes})")
        elif self._backoff and time.monotonic() - self._space_error_at < self._backoff:
            return self.refusal  # an allocation failed lately: keep refusing until its back-off has passed
        if reason is None and self.refusal is not None:
            log.warning("store disk %s has room again (%.1f%% used, %d bytes free): writes resume",
                        self.path, ratio, u.available)
            self._backoff = 0.0
        elif reason is not None and self.refusal is None:
            log.error("store disk is full, writes are refused (reads go on): %s", reason)
        self.refusal = reason
        return reason

    def space_error(self, exc: Exception) -> DiskFullError:
        """An allocation or write met ENOSPC (``exc``): refuse writes with back-off; the error for the caller."""
        now = time.monotonic()
        self._backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff * 2))
        self._space_error_at = now
        self.refusal = f"{exc}; writes are refused for at least {self._backoff:.0f} s"
        self._log(logging.ERROR, "store: %s", self.refusal)
        return DiskFullError(self.refusal)

    def refuse(self) -> DiskFullError:
        self.refused_puts += 1
        return DiskFullError(self.refusal or "service not available now, maybe disk full")
