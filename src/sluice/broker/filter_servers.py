"""The broker's filter servers (RocketMQ's FilterServerManager,
broker/src/main/java/org/apache/rocketmq/broker/filtersrv/FilterServerManager.java).

* REGISTER_FILTER_SERVER (301, header filterServerAddr) records a filter server
  by the connection it came on and answers brokerName and brokerId. A filter
  server re-registers every 10 s; one silent for ``FILTER_SERVER_EXPIRY_S`` is
  dropped, and one whose connection closes is dropped at once. Every change
  re-registers the broker with its namesrvs, whose routes then list the live
  addresses in ``filterServerTable`` (keyed by this broker's address).
* With ``filter_server_nums = N`` the broker runs N ``sluice filtersrv``
  children (the broker never imports the filter server: it starts it by command
  line) and restarts any that exits, after a back-off that doubles from 1 s to
  30 s while children keep dying young. A child keeps its port across restarts,
  so consumers' routes stay right.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.errors import InvalidParameterError
from sluice.protocol.codes import ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection

__all__ = ["FilterServerManager", "FilterServerChildren", "FILTER_SERVER_EXPIRY_S", "tls_args"]

log = logging.getLogger(__name__)

#: A filter server not heard from this long is dropped (RocketMQ's FilterServerMaxIdleTimeMills: 30 s,
#: three missed 10 s registrations).
FILTER_SERVER_EXPIRY_S = 30.0
#: How often silent filter servers are looked for.
EXPIRY_SCAN_S = 5.0
#: Restart back-off of a child that exited: doubles from the first to the last while children die young.
RESTART_BACKOFF_S = (1.0, 30.0)
#: A child that ran this long before exiting restarts after the shortest back-off again.
HEALTHY_RUN_S = 60.0
#: How long a stopping child gets after SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0


@dataclass(slots=True)
class _Registered:
    addr: str
    last_seen: float


class FilterServerManager:
    """The filter servers registered with this broker; also the handler of 301 (broker/requests.py)."""

    def __init__(self, *, broker_name: str, broker_id: int, on_change: Callable[[], None] = lambda: None,
                 expiry_s: float = FILTER_SERVER_EXPIRY_S) -> None:
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.on_change = on_change
        self.expiry_s = expiry_s
        self._table: dict[RemotingConnection, _Registered] = {}

    def register(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        addr = (request.ext_fields.get("filterServerAddr") or "").strip()
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidParameterError(f"REGISTER_FILTER_SERVER: filterServerAddr {addr!r} is not HOST:PORT")
        known = self._table.get(conn)
        if known is None or known.addr != addr:
            if known is None:
                conn.on_close(self.connection_closed)
            log.info("filter server %s registered (from %s)", addr, conn.peer)
            self._table[conn] = _Registered(addr, time.monotonic())
            self.on_change()
        else:
            known.last_seen = time.monotonic()
        return request.make_response(ResponseCode.SUCCESS, ext_fields={"brokerName": self.broker_name,
                                                                       "brokerId": str(self.broker_id)})

    def connection_closed(self, conn: RemotingConnection) -> None:
        gone = self._table.pop(conn, None)
        if gone is not None:
            log.info("filter server %s dropped: its connection closed", gone.addr)
            self.on_change()

    def expire(self, now: float | None = None) -> list[str]:
        """Drop filter servers silent for ``expiry_s``; their addresses."""
        now = time.monotonic() if now is None else now
        gone = [c for c, r in self._table.items() if now - r.last_seen > self.expiry_s]
        addrs = [self._table.pop(c).addr for c in gone]
        for addr in addrs:
            log.warning("filter server %s dropped: silent for over %g s", addr, self.expiry_s)
        if addrs:
            self.on_change()
        return addrs

    def is_filter_server(self, conn: RemotingConnection) -> bool:
        """Whether ``conn`` is a registered filter server's (its pulls are not a consumer group member's)."""
        return conn in self._table

    def addresses(self) -> list[str]:
        """The live filter servers' addresses, as the namesrv registration lists them."""
        return sorted({r.addr for r in self._table.values()})


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class FilterServerChildren:
    """``count`` ``sluice filtersrv`` child processes for the broker at ``broker_addr``, kept running."""

    def __init__(self, count: int, broker_addr: str, host: str, extra_args: list[str], *,
                 env: dict[str, str] | None = None) -> None:
        self.count = count
        self.broker_addr = broker_addr
        self.host = host
        self.extra_args = extra_args
        self.env = env
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self.ports: list[int] = [0] * count
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def argv(self, slot: int) -> list[str]:
        return [sys.executable, "-m", "sluice", "filtersrv", "--broker", self.broker_addr,
                "--listen", f"{self.host}:{self.ports[slot]}", "--parent-pid", str(os.getpid()), *self.extra_args]

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep(slot), name=f"filtersrv-child-{slot}")
                       for slot in range(self.count)]

    async def _keep(self, slot: int) -> None:
        backoff = RESTART_BACKOFF_S[0]
        failures_on_port = 0
        while not self._stopping:
            if not self.ports[slot] or failures_on_port >= 3:  # a port another process took: pick another
                self.ports[slot], failures_on_port = _free_port(self.host), 0
            started = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(*self.argv(slot), env=self.env,
                                                            stdin=asyncio.subprocess.DEVNULL)
            except OSError as exc:
                log.error("cannot start filter server %d: %s", slot, exc)
                rc: int | None = None
            else:
                self.procs[slot] = proc
                log.info("filter server %d started: pid %d on %s:%d", slot, proc.pid, self.host, self.ports[slot])
                rc = await proc.wait()
            if self._stopping:
                return
            ran = time.monotonic() - started
            if ran >= HEALTHY_RUN_S:
                backoff, failures_on_port = RESTART_BACKOFF_S[0], 0
            else:
                failures_on_port += 1
            self.restarts += 1
            log.warning("filter server %d (port %d) exited with status %s after %.1f s; restarting in %g s", slot,
                        self.ports[slot], rc, ran, backoff)
            await asyncio.sleep(backoff)
            if ran < HEALTHY_RUN_S:
                backoff = min(backoff * 2, RESTART_BACKOFF_S[1])

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.returncode is None]

    async def stop(self) -> None:
        self._stopping = True
        for p in self.procs:
            if p is not None and p.returncode is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            if p is None:
                continue
            try:
                async with asyncio.timeout(STOP_GRACE_S):
                    await p.wait()
            except TimeoutError:
                log.warning("filter server pid %d ignored SIGTERM; killing it", p.pid)
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
                await p.wait()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def tls_args(tls_mode: str, tls_cert: str, tls_key: str, tls_client_ca: str) -> list[str]:
    """The children's TLS flags from the broker's settings: their port serves TLS as the broker's does (its
    mode, certificate and client CA), and they reach the broker over TLS, trusting exactly its certificate
    (pinned: the address they dial need not be a name it carries). With a client CA (mutual TLS) they present
    the broker's own certificate, which must then be signed by that CA (docs/security.md). Paths absolute:
    the children may run elsewhere."""
    if tls_mode == "disabled":
        return []
    cert, key = os.path.abspath(tls_cert), os.path.abspath(tls_key)
    args = ["--tls-mode", tls_mode, "--tls-cert", cert, "--tls-key", key,
            "--broker-tls", "--broker-tls-ca", cert, "--broker-tls-pin"]
    if tls_client_ca:
        args += ["--tls-client-ca", os.path.abspath(tls_client_ca), "--broker-tls-cert", cert, "--broker-tls-key", key]
    return args


def child_env(access_key: str = "", secret_key: str = "") -> dict[str, str]:
    """The children's environment: the broker's (the same interpreter and packages), and the broker's ACL
    account for their requests to it (in the environment, which other users cannot read, not in flags)."""
    env = dict(os.environ)
    if access_key:
        env["SLUICE_FILTERSRV_ACCESS_KEY"], env["SLUICE_FILTERSRV_SECRET_KEY"] = access_key, secret_key
    return env
