"""The servers' side of the ACL: the policy file, reloaded when it changes, and the refusal log.

The broker and the namesrv each hold one ``AclGuard`` and call ``check`` before a request's handler.
A changed file is read again at most every ``reload_interval`` seconds (RocketMQ's PlainPermissionManager
watches the file too); a file that no longer parses leaves the last good policy in force, and says so.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.acl.policy import Need, Policy, load_policy
from sluice.errors import AclConfigError, NoPermissionError

__all__ = ["AclGuard"]

log = logging.getLogger(__name__)

_monotonic = time.monotonic

#: A client refused for one reason is logged once per this many seconds.
REFUSAL_LOG_INTERVAL = 60.0
#: At most this many (client, reason) pairs are remembered for the rate limit; then the memory starts over.
_MAX_REMEMBERED = 10_000


class AclGuard:
    def __init__(self, path: str | Path, *, reload_interval: float = 3.0) -> None:
        self.path = Path(path)
        self.reload_interval = reload_interval
        self.policy: Policy = load_policy(self.path)  # a bad file at start is the operator's error: raise
        self._mtime = self._stat()
        self._checked = time.monotonic()
        self._logged: dict[tuple[str, str], float] = {}
        log.info("ACL on: %s (%d accounts, %d global white addresses)", self.path,
                 len(self.policy.accounts), len(self.policy.global_white))

    def _stat(self) -> float | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def maybe_reload(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._checked < self.reload_interval:
            return
        self._checked = now
        mtime = self._stat()
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self.policy = load_policy(self.path)
        except AclConfigError as exc:
            log.error("ACL file changed but cannot be used; the previous policy stays in force: %s", exc)
            return
        log.info("ACL reloaded: %s (%d accounts)", self.path, len(self.policy.accounts))

    def check(self, peer: str, ext_fields: Mapping[str, Any], body: bytes | None, need: Need) -> None:
        """Raise NoPermissionError (logged once per client and reason a minute) unless the request may run.

        Every request's signature is verified; what a signed account may do is remembered per need by the
        policy (``Need.key``), and forgotten with it when the file is reloaded."""
        now = _monotonic()
        if now - self._checked >= self.reload_interval:
            self.maybe_reload(now)
        host = peer.rpartition(":")[0] or peer
        try:
            self.policy.decide(host, ext_fields, body, need)
        except NoPermissionError as exc:
            self._log_refusal(host, str(exc))
            raise

    def _log_refusal(self, host: str, reason: str) -> None:
        now = time.monotonic()
        key = (host, reason)
        last = self._logged.get(key)
        if last is not None and now - last < REFUSAL_LOG_INTERVAL:
            return
        if len(self._logged) >= _MAX_REMEMBERED:
            self._logged.clear()
        self._logged[key] = now
        log.warning("ACL refused a request from %s: %s", host, reason)
