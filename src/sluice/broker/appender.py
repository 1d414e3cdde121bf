"""Group commit at the broker: sends that arrive together go to the store in one thread-pool job per queue.

Each send would otherwise cost a thread hop (and, with ``--flush sync``, an
fsync wait) of its own. Handlers call :meth:`Appender.put`; the messages of
every request for the same topic/queue seen in one event-loop iteration are
appended with one ``put_messages`` call on the broker's thread pool, and each
request gets its own slice of the results. If the merged call is refused
(one request holds an illegal message; the store validates everything before
writing anything), the requests are retried one by one so only the bad one
fails.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from sluice.errors import SluiceError
from sluice.store import MessageStore, PutResult, StoreMessage

__all__ = ["Appender"]

log = logging.getLogger(__name__)

Key = tuple[str, int]
_Pending = list[tuple[list[StoreMessage], asyncio.Future[list[PutResult]]]]


class Appender:
    def __init__(self, store: MessageStore, executor: Executor, *, max_messages_per_job: int = 1024) -> None:
        self.store = store
        self.executor = executor
        self.max_messages_per_job = max_messages_per_job
        self._pending: dict[Key, _Pending] = {}
        self._scheduled = False
        self.jobs = 0
        self.requests = 0

    async def put(self, msgs: list[StoreMessage]) -> list[PutResult]:
        """Append one request's messages (all for one topic/queue); results in order."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[PutResult]] = loop.create_future()
        self._pending.setdefault((msgs[0].topic, msgs[0].queue_id), []).append((msgs, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._submit)  # after the other handlers ready in this iteration
        return await fut

    def _submit(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        loop = asyncio.get_running_loop()
        for group in pending.values():
            for chunk in self._chunks(group):
                self.jobs += 1
                self.requests += len(chunk)
                job = loop.run_in_executor(self.executor, self._append, [m for m, _ in chunk])
                job.add_done_callback(_deliver(chunk))

    def _chunks(self, group: _Pending) -> list[_Pending]:
        out: list[_Pending] = []
        cur: _Pending = []
        n = 0
        for item in group:
            if cur and n + len(item[0]) > self.max_messages_per_job:
                out.append(cur)
                cur, n = [], 0
            cur.append(item)
            n += len(item[0])
        if cur:
            out.append(cur)
        return out

    def _append(self, requests: list[list[StoreMessage]]) -> list[list[PutResult] | BaseException]:
        """Runs on the thread pool: one store call for all, or one per request if the merged one fails."""
        if len(requests) == 1:
            try:
                return [self.store.put_messages(requests[0])]
            except Exception as exc:
                return [exc]
        merged = [m for msgs in requests for m in msgs]
        try:
            results = self.store.put_messages(merged)
        except SluiceError:
            out: list[list[PutResult] | BaseException] = []
            for msgs in requests:
                try:
                    out.append(self.store.put_messages(msgs))
                except Exception as exc:
                    out.append(exc)
            return out
        except Exception as exc:
            return [exc] * len(requests)
        out2: list[list[PutResult] | BaseException] = []
        pos = 0
        for msgs in requests:
            out2.append(results[pos:pos + len(msgs)])
            pos += len(msgs)
        return out2


def _deliver(chunk: _Pending) -> Callable[[asyncio.Future], None]:
    def done(job: asyncio.Future) -> None:
        if job.cancelled():
            for _, fut in chunk:
                if not fut.done():
                    fut.cancel()
            return
        exc = job.exception()
        outcomes = [exc] * len(chunk) if exc is not None else job.result()
        for (_, fut), outcome in zip(chunk, outcomes):
            if fut.done():  # the request was cancelled (its connection closed) meanwhile
                continue
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
    return done
