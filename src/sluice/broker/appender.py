"""Group commit at the broker: sends that arrive together go to the store in one append per queue.

Handlers call :meth:`Appender.put`; the messages of every request for the same
topic/queue seen in one event-loop iteration are appended with one
``put_messages`` call, and each request gets its own slice of the results. If
the merged call is refused (one request holds an illegal message; the store
validates everything before writing anything), the requests are appended one
by one so only the bad one fails.

The append runs on the event loop itself: it copies bytes into the mapped
commit log and never waits for the disk, and a hop to a pool thread and back
cost more than the append (and made the loop and the pool fight for the GIL).
With ``--flush sync`` the replies then wait for durability: one pool job per
loop iteration waits for the store's group commit to cover every append of
that iteration, so all of them share its fsyncs and none blocks the loop.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor

from sluice.errors import SluiceError
from sluice.store import MessageStore, PutResult, StoreMessage
from sluice.store.encode import EncodedBatch

__all__ = ["Appender"]

log = logging.getLogger(__name__)

Key = tuple[str, int]
_Pending = list[tuple[list[StoreMessage], asyncio.Future[list[PutResult]]]]
_Outcome = list[PutResult] | BaseException


class Appender:
    def __init__(self, store: MessageStore, executor: Executor, *, max_messages_per_job: int = 1024) -> None:
        self.store = store
        self.executor = executor
        self.max_messages_per_job = max_messages_per_job
        self._pending: dict[Key, _Pending] = {}
        self._scheduled = False
        self._dispatch_scheduled = False
        self.jobs = 0
        self.requests = 0

    async def put(self, msgs: list[StoreMessage]) -> list[PutResult]:
        """Append one request's messages (all for one topic/queue); results in order, once durable."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[PutResult]] = loop.create_future()
        self._pending.setdefault((msgs[0].topic, msgs[0].queue_id), []).append((msgs, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._submit)  # after the other handlers ready in this iteration
        return await fut

    def put_now(self, msgs: list[StoreMessage]) -> list[PutResult]:
        """Append one request's messages right away, for a broker with asynchronous flush: nothing to wait
        for, so no future and no loop iteration (batches gain most; the store's errors propagate)."""
        return self._appended(self.store.put_messages(msgs, wait_durable=False))

    def put_encoded(self, topic: str, queue_id: int, enc: EncodedBatch) -> list[PutResult]:
        """put_now for a batch encoded already (encode.encode_batch_body)."""
        return self._appended(self.store.put_encoded(topic, queue_id, enc, wait_durable=False))

    def _appended(self, results: list[PutResult]) -> list[PutResult]:
        self.jobs += 1
        self.requests += 1
        self._dispatch_soon()
        return results

    # ---- dispatch on the loop (store.dispatch.drive_externally) ------------------------------------
    def _dispatch_soon(self) -> None:
        """Dispatch this iteration's appends once the loop gets to it (after the replies went out)."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        dispatch = self.store.dispatch
        if dispatch.error is not None:
            return  # the dispatch thread retries and reports it (DispatchService._run)
        try:
            dispatch.reput()
        except Exception:  # the thread's next poll meets it again and records it
            log.exception("dispatch on the event loop failed; the dispatch thread takes over")

    def _submit(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        durable_end = -1
        to_confirm: list[tuple[_Pending, list[_Outcome]]] = []
        for group in pending.values():
            for chunk in self._chunks(group):
                self.jobs += 1
                self.requests += len(chunk)
                outcomes = self._append([m for m, _ in chunk])
                self._dispatch_soon()
                if self.store.sync_flush:
                    ends = [r[-1].commitlog_offset + r[-1].size for r in outcomes
                            if r and not isinstance(r, BaseException)]
                    if ends:
                        durable_end = max(durable_end, *ends)
                        to_confirm.append((chunk, outcomes))
                        continue
                _deliver(chunk, outcomes)
        if to_confirm:
            job = asyncio.get_running_loop().run_in_executor(self.executor, self.store.wait_durable, durable_end)
            job.add_done_callback(lambda j: _confirm(j, to_confirm))

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

    def _append(self, requests: list[list[StoreMessage]]) -> list[_Outcome]:
        """One store call for all, or one per request if the merged one is refused."""
        put = self.store.put_messages
        if len(requests) == 1:
            try:
                return [put(requests[0], wait_durable=False)]
            except Exception as exc:
                return [exc]
        merged = [m for msgs in requests for m in msgs]
        try:
            results = put(merged, wait_durable=False)
        except SluiceError:
            out: list[_Outcome] = []
            for msgs in requests:
                try:
                    out.append(put(msgs, wait_durable=False))
                except Exception as exc:
                    out.append(exc)
            return out
        except Exception as exc:
            return [exc] * len(requests)
        out2: list[_Outcome] = []
        pos = 0
        for msgs in requests:
            out2.append(results[pos:pos + len(msgs)])
            pos += len(msgs)
        return out2


def _deliver(chunk: _Pending, outcomes: list[_Outcome]) -> None:
    for (_, fut), outcome in zip(chunk, outcomes):
        if fut.done():  # the request was cancelled (its connection closed) meanwhile
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


def _confirm(job: asyncio.Future[None], waiting: list[tuple[_Pending, list[_Outcome]]]) -> None:
    """The group commit covered the appends (or timed out: each request then gets the error)."""
    exc = None if job.cancelled() else job.exception()
    for chunk, outcomes in waiting:
        if job.cancelled():
            for _, fut in chunk:
                if not fut.done():
                    fut.cancel()
            continue
        _deliver(chunk, outcomes if exc is None else [o if isinstance(o, BaseException) else exc for o in outcomes])
