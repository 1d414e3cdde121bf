"""Serving Prometheus text at ``/metrics`` (``--metrics-listen HOST:PORT``) for the broker and the namesrv.

prometheus_client's own HTTP server runs on a daemon thread of its own, so a
scrape never blocks the event loop; a server's collector gathers its figures
on that loop (``gather_on_loop``), where they are kept without locks, and the
loop pays nothing between scrapes.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from sluice.errors import InvalidParameterError, SluiceError

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

__all__ = ["LoopGathered", "MetricsServer", "gather_on_loop", "parse_metrics_listen", "SCRAPE_TIMEOUT_S"]

#: How long a scrape waits for the server's loop (Prometheus' default scrape_timeout is 10 s).
SCRAPE_TIMEOUT_S = 8.0

T = TypeVar("T")


def parse_metrics_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) → (host, port), or an error naming the setting."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidParameterError(f"metrics_listen {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def gather_on_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, T]],
                   timeout: float = SCRAPE_TIMEOUT_S) -> T:
    """Run ``make()`` on ``loop`` from another thread (the scrape's) and wait for its result."""
    return asyncio.run_coroutine_threadsafe(make(), loop).result(timeout)


class LoopGathered:
    """A server's collector half: ``collect`` (the scrape's thread) runs the subclass's ``gather`` coroutine on
    the server's loop, once ``bind`` gave it; before that a scrape gets nothing."""

    loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterable[Any]:
        if self.loop is None:
            return iter(())
        return iter(gather_on_loop(self.loop, self.gather))

    async def gather(self) -> list[Any]:
        raise TypeError(f"{type(self).__name__} must define gather()")


class MetricsServer:
    """``/metrics`` on exactly ``listen``, from ``collectors``; ``start`` raises SluiceError if it cannot bind."""

    def __init__(self, listen: str, collectors: Iterable[Collector]) -> None:
        from prometheus_client import CollectorRegistry  # loaded only by servers that serve metrics

        self.listen = listen
        self.host, self.port = parse_metrics_listen(listen)
        self.registry = CollectorRegistry(auto_describe=False)
        for c in collectors:
            self.registry.register(c)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        except OSError as exc:  # taken, not an address of this host, no permission
            raise SluiceError(f"cannot serve metrics on {self.listen}: {exc.strerror or exc}") from None
        self.port = self._server.server_address[1]  # the real one when 0 was asked

    @property
    def bound(self) -> tuple[str, int] | None:
        """The (host, port) the server listens on; None before ``start`` or after ``close``."""
        return None if self._server is None else tuple(self._server.server_address[:2])  # type: ignore[return-value]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
