"""Subscription compilation off the event loop, cached by exact expression, bounded per client.

A 400-term SQL92 selector takes long to compile; done on the event loop, a
storm of distinct ones stalls every other connection. A subscription already
compiled (cache hit), or whose expression is (``compiled_selector``: another
group's, or this group's before a restart gave it a new subscription version),
is answered on the loop at no extra cost;
a new one is compiled on one dedicated thread (not the store's pool, so reads
never queue behind compilations) while the request waits as a coroutine. Each
connection may start at most ``max_selector_compiles_per_client_per_minute``
new compilations per minute; past it the request is refused with SYSTEM_BUSY
naming the setting (clients retry later), logged at most once a minute per
connection. TAG subscriptions compile in linear time and stay on the loop.
Compile errors are cached like results (a client repeating a bad expression
gets SUBSCRIPTION_PARSE_FAILED at once, uncharged), and requests arriving for an
expression already being compiled wait for that one compilation. The consumer
filter data restored at start is compiled on the same thread (``run``).
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sluice.broker.filtering import CompiledSubscription, compile_subscription, is_tag_type
from sluice.errors import SelectorCompileBusyError, SluiceError
from sluice.filter import compiled_selector

__all__ = ["SelectorCompiler", "COMPILES"]

log = logging.getLogger(__name__)

#: Key in RemotingConnection.attributes: [minute window start (monotonic s), compiles in it, last log time].
COMPILES = "selector_compiles"

Key = tuple[str, str | None, str | None, int, bool]
T = TypeVar("T")


class SelectorCompiler:
    def __init__(self, *, max_per_client_per_minute: int, cache_size: int = 4096) -> None:
        self.max_per_minute = max_per_client_per_minute
        self.cache_size = cache_size
        self._cache: OrderedDict[Key, CompiledSubscription | SluiceError] = OrderedDict()
        self._pending: dict[Key, asyncio.Future[CompiledSubscription]] = {}
        self._executor: ThreadPoolExecutor | None = None
        #: New compilations done off the loop, and requests refused over the per-client limit.
        self.compiled = 0
        self.refused = 0

    def cached(self, topic: str, expression_type: str | None, expression: str | None, sub_version: int,
               enable_property_filter: bool) -> CompiledSubscription | None:
        """The compiled subscription when it needs no new compilation (cache hit, or a TAG expression,
        compiled here: linear in its length); None when it must go through :meth:`compile`."""
        key = (topic, expression_type, expression, sub_version, enable_property_filter)
        sub = self._cache.get(key)
        if sub is not None:
            self._cache.move_to_end(key)
            if isinstance(sub, SluiceError):
                raise copy.copy(sub)
            return sub
        if is_tag_type(expression_type) or compiled_selector(expression_type, expression) is not None:
            # A tag expression, or one compiled already (another group's, this group's previous subscription
            # version: each consumer start is a new version): no compilation to take off the loop, only the
            # subscription to build, where the thread's round trip cost more than a millisecond.
            sub = compile_subscription(topic, expression_type, expression, sub_version,
                                       enable_property_filter=enable_property_filter)
            self._put(key, sub)
            return sub
        return None

    async def compile(self, attributes: dict, peer: str, topic: str, expression_type: str | None,
                      expression: str | None, sub_version: int, enable_property_filter: bool) -> CompiledSubscription:
        """Compile on the compile thread (after the per-connection limit); raises the compile error."""
        sub = self.cached(topic, expression_type, expression, sub_version, enable_property_filter)
        if sub is not None:
            return sub
        key = (topic, expression_type, expression, sub_version, enable_property_filter)
        pending = self._pending.get(key)
        if pending is not None:  # the same new expression is being compiled for another request
            return await asyncio.shield(pending)
        self._charge(attributes, peer)
        fut = asyncio.get_running_loop().run_in_executor(
            self._thread(), lambda: compile_subscription(topic, expression_type, expression, sub_version,
                                                         enable_property_filter=enable_property_filter))
        self._pending[key] = fut
        try:
            sub = await asyncio.shield(fut)
        except SluiceError as e:
            self._put(key, e.with_traceback(None))
            raise
        finally:
            self._pending.pop(key, None)
        self.compiled += 1
        self._put(key, sub)
        return sub

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the compile thread: the broker compiles its restored filter data with it at start
        (filter_data.py ``compile_restored``)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread(), fn)

    def _thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-selector-compile")
        return self._executor

    def _charge(self, attributes: dict, peer: str) -> None:
        now = time.monotonic()
        state = attributes.get(COMPILES)
        if state is None or now - state[0] >= 60.0:
            state = attributes[COMPILES] = [now, 0, state[2] if state else -1e9]
        if state[1] >= self.max_per_minute:
            self.refused += 1
            if now - state[2] >= 60.0:
                state[2] = now
                log.warning("client %s refused: more than %d new selector compilations in a minute "
                            "(max_selector_compiles_per_client_per_minute)", peer, self.max_per_minute)
            raise SelectorCompileBusyError(
                f"too many new subscription expressions from this client: at most {self.max_per_minute} "
                "compilations per minute (max_selector_compiles_per_client_per_minute); retry later")
        state[1] += 1

    def _put(self, key: Key, sub: CompiledSubscription | SluiceError) -> None:
        self._cache[key] = sub
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
