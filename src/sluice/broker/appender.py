"""The broker's one road to the store: :meth:`Appender.put`, for sends, consumer retries and delayed deliveries.

One call, whatever the request: a message list or a batch body encoded
already (``store.encode.encode_batch_body``), checked against a duplicate
window or not, waited for durably or not. Every write reaches the store in
:meth:`Appender._write`, and every durable wait in one request per merge.

* **Merged.** Single messages, and every message list under ``sync``, wait
  for the end of the read that brought them (``after_read``: the connection
  runs it once the read's frames are handled, in the same loop iteration; a
  put made outside a read waits for the end of the iteration): the lists of
  every request for the same topic/queue seen meanwhile are appended with one
  ``put_messages`` call, and each request gets its own slice of the results.
  If the merged call fails (one request holds an illegal message or one the
  encoder cannot take; the store encodes and validates everything before
  writing anything), the requests are appended one by one so only the bad one
  fails, whatever the error.
* **At once.** An encoded batch, and a list of several messages without
  ``sync``, are appended before ``put`` returns; without ``sync`` so are their
  results (no future, no loop iteration; the store's errors propagate to the
  caller).
* **Durable.** With ``sync`` the results are handed back once the store's
  group commit covers them: each merge hands its replies and the highest
  end appended in it to durable.py, which asks the store's fsync thread
  for a round at once (before the merge's dispatch, so the two
  overlap) and answers all that one fsync covered with one wake-up of the
  loop; none blocks it.
* **Called back.** With ``then``, a result that has to wait is handed to
  ``then(stored, error)`` on the loop instead of a future, and ``put``
  returns None: a round's replies are then written by the callback that
  learns of the fsync, in one write per connection (``begin_writes``),
  with no task and no loop iteration per request.
* **Checked.** With a ``dedup`` window, replayed UNIQ_KEYs are answered with
  their originals and only the rest is written, by the rules above (dedup.py).

Appends run on the event loop itself: they copy bytes into the mapped commit
log (or its page cache) and never wait for the disk, and a hop to a pool thread
and back costs more than the append. Dispatch runs on the loop after the
appends (``store.dispatch.drive_externally``): merged appends dispatch at once,
before their replies are written (a sender that has its reply finds its message
visible), and the held pulls the dispatch wakes are answered right after it
(``HoldService.begin_fires``), their answers leaving in one write batch with
the replies: a send, its reply and the pull it wakes take one loop iteration.
The key index, which neither needs, is built right after that batch is
written (``DispatchService.reput(index_later=True)``; a key query builds it
first), so the socket write does not wait for it.
Other appends dispatch at the end of their read (or iteration), once the
replies their handlers gave at once went out.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sluice.broker.durable import DurableWaiter
from sluice.errors import DiskFullError
from sluice.store import MessageStore, PutResult, StoreMessage
from sluice.store.encode import EncodedBatch
from sluice.transport.batching import after_read, begin_writes, end_writes

if TYPE_CHECKING:
    from sluice.broker.dedup import DedupWindow
    from sluice.broker.longpoll import HoldService
    from sluice.broker.metrics import PutLatency

__all__ = ["Appender", "Payload", "Stored", "Then", "stored"]

log = logging.getLogger(__name__)

#: What a request stores: its messages, or its batch body encoded to records already.
Payload = list[StoreMessage] | EncodedBatch
#: (the queue the messages are in as the request asked: a delayed message is diverted to a schedule
#: queue but reported in its own; a pure replay names its originals' queue, results in order).
Stored = tuple[int, list[PutResult]]
Prepare = Callable[[list[StoreMessage]], None]
#: A waiting result's receiver: (the results, None) once durable, or (None, the error); called on the loop.
Then = Callable[[Stored | None, BaseException | None], None]

Key = tuple[str, int]
_Waiting = tuple[list[StoreMessage], int, bool, "_Sink"]  # messages, queue asked, sync, reply
_Reply = tuple["_Sink", int]  # the request's future (or callback), the queue it asked for
_Outcome = list[PutResult] | BaseException


class _Callback:
    """A future's setting side around a :data:`Then`: called at once, no loop iteration in between."""
    __slots__ = ("then", "called")

    def __init__(self, then: Then) -> None:
        self.then = then
        self.called = False

    def done(self) -> bool:
        return self.called

    def set_result(self, stored: Stored) -> None:
        self.called = True
        self._call(stored, None)

    def set_exception(self, exc: BaseException) -> None:
        self.called = True
        self._call(None, exc)

    def _call(self, stored: Stored | None, exc: BaseException | None) -> None:
        try:
            self.then(stored, exc)
        except Exception:  # one bad reply must not strand the others delivered with it
            log.exception("answering a stored request failed")


_Sink = asyncio.Future | _Callback


async def stored(result: Stored | Awaitable[Stored]) -> Stored:
    """:meth:`Appender.put`'s result, awaited when it had to wait (for callers that may wait anyway)."""
    return result if type(result) is tuple else await result  # type: ignore[misc]


class Appender:
    def __init__(self, store: MessageStore, *, max_messages_per_job: int = 1024) -> None:
        self.store = store
        self.max_messages_per_job = max_messages_per_job
        #: The store's flush mode: the default of ``put(sync=...)``.
        self.sync_flush: bool = store.sync_flush
        self._merging: dict[Key, list[_Waiting]] = {}
        self._durable: list[tuple[_Reply, _Outcome]] = []  # appended this iteration, to be confirmed durable
        self._waiter: DurableWaiter[tuple[list[_Reply], list[_Outcome]]] | None = None  # made on first use
        self._submit_scheduled = False
        self._dispatch_scheduled = False
        self._undispatched = False  # appended since the last dispatch
        self.jobs = 0  # store calls
        self.requests = 0  # requests those calls wrote
        self.messages = 0  # messages written
        #: Told of each store call (topic, messages, bytes of the log they took): the broker's stats.py.
        self.on_put: Callable[[str, int, int], None] | None = None
        #: The put latency histogram (metrics.py): one observation per store call; None unless metrics are served.
        self.latency: PutLatency | None = None
        #: The held pulls (set by the controller): those a dispatch here wakes are answered right after it.
        self.hold: HoldService | None = None

    def put(self, topic: str, queue_id: int, payload: Payload, *, dedup: DedupWindow | None = None,
            sync: bool | None = None, prepare: Prepare | None = None,
            then: Then | None = None) -> Stored | Awaitable[Stored] | None:
        """Store one request's messages (all for ``topic``/``queue_id`` as asked); see the module doc.

        ``sync`` (default: the store's flush mode) hands the results back only once they are durable;
        ``dedup`` checks each UNIQ_KEY against that window (message lists only); ``prepare`` is applied
        in place to the messages about to be written, after the duplicate check (the schedule service's
        divert of delayed messages). Returns the results at once when nothing had to wait, otherwise an
        awaitable of them (see :func:`stored`), or, given ``then`` (not with ``dedup``), None: ``then``
        gets them (or the error) on the loop, never before ``put`` returned."""
        if sync is None:
            sync = self.sync_flush
        if dedup is not None:
            if then is not None:
                raise TypeError("a duplicate check answers through its awaitable, not a callback")
            return self._put_checked(dedup, topic, queue_id, payload, sync, prepare)  # type: ignore[arg-type]
        return self._put(topic, queue_id, payload, sync, prepare, then)

    def _put(self, topic: str, queue_id: int, payload: Payload, sync: bool,
             prepare: Prepare | None, then: Then | None = None) -> Stored | asyncio.Future[Stored] | None:
        if type(payload) is list:
            if prepare is not None:
                prepare(payload)
            if sync or len(payload) == 1:
                return self._merge(payload, queue_id, sync, then)
            m = payload[0]
            self._dispatch_soon()
            results = self._write(m.topic, m.queue_id, payload)
        else:
            self._dispatch_soon()
            results = self._write(topic, queue_id, payload)
        self.jobs += 1
        self.requests += 1
        if sync:
            sink = _sink(then)
            self._durable.append(((sink, queue_id), results))
            self._submit_soon()
            return sink if then is None else None  # type: ignore[return-value]
        return queue_id, results

    async def _put_checked(self, window: DedupWindow, topic: str, queue_id: int, msgs: list[StoreMessage],
                           sync: bool, prepare: Prepare | None) -> Stored:
        if type(msgs) is not list:
            raise TypeError("a duplicate check needs the request's messages, not an encoded batch")

        async def write(batch: list[StoreMessage]) -> list[PutResult]:
            return (await stored(self._put(topic, queue_id, batch, sync, prepare)))[1]

        originals = await window.put(topic, msgs, write)
        first = originals[0].queue_id
        if all(o.queue_id == first for o in originals):
            queue_id = first  # a pure replay names the queue its originals are in
        return queue_id, [o.result for o in originals]

    # ---- the store -----------------------------------------------------------------------------------
    def _write(self, topic: str, queue_id: int, payload: Payload) -> list[PutResult]:
        """Every append of the broker: never waits for the disk (durability is waited for separately). The
        caller dispatches it (``_submit``) or has scheduled a dispatch (``_dispatch_soon``)."""
        self._undispatched = True
        store = self.store
        latency = self.latency
        t0 = time.perf_counter() if latency is not None else 0.0
        if type(payload) is list:
            results = store.put_messages(payload, wait_durable=False)
        else:
            results = store.put_encoded(topic, queue_id, payload, wait_durable=False)  # type: ignore[arg-type]
        if latency is not None:
            latency.observe(time.perf_counter() - t0)
        self.messages += len(results)
        if results and self.on_put is not None:
            last = results[-1]
            self.on_put(topic, len(results), last.commitlog_offset + last.size - results[0].commitlog_offset)
        return results

    def _dispatch_soon(self) -> None:
        """Dispatch once the replies the handlers of this read (or loop iteration) gave at once went out."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            if not after_read(self._dispatch):
                asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        if self._submit_scheduled:  # the durable wait first: its fsync runs on its own thread during dispatch
            try:
                self._submit()
            except Exception:  # (as the loop would log it) dispatch still runs, and is scheduled again later
                log.exception("answering this iteration's appends failed")
        self._dispatch_scheduled = False
        self.dispatch_now()

    def dispatch_now(self, *, index_later: bool = False) -> None:
        """Dispatch what was appended since the last dispatch (nothing when nothing was), then answer the held
        pulls it woke: their consume-queue units are written by then, so no loop iteration waits between.
        With ``index_later`` the key-index entries wait for :meth:`index_deferred` (no reader of a queue
        needs them; a key query builds them first: ``DispatchService.index_deferred``)."""
        if not self._undispatched:
            return
        self._undispatched = False
        dispatch = self.store.dispatch
        if dispatch.error is not None:
            return  # the dispatch thread retries and reports it (DispatchService._run)
        hold = self.hold
        fires = hold is not None and hold.begin_fires()
        try:
            dispatch.reput(index_later=index_later)
        except DiskFullError as exc:  # no room for queue or index bytes: the dispatch thread backs off and logs
            dispatch.error = exc
        except Exception:  # the thread's next poll meets it again and records it
            log.exception("dispatch on the event loop failed; the dispatch thread takes over")
        finally:
            if fires:
                hold.end_fires()  # type: ignore[union-attr]

    def index_deferred(self) -> None:
        """Build the key-index entries a ``dispatch_now(index_later=True)`` left (once its answers went out)."""
        dispatch = self.store.dispatch
        try:
            dispatch.index_deferred()
        except DiskFullError as exc:  # as in dispatch_now: the thread backs off, retries them first, and logs
            dispatch.error = exc
        except Exception:  # kept: the next reput (or the dispatch thread's) builds them first
            log.exception("key index after dispatch on the event loop failed; the dispatch thread retries")

    # ---- the end of each loop iteration: merged appends, then one wait for durability -----------------
    def _merge(self, msgs: list[StoreMessage], queue_id: int, sync: bool,
               then: Then | None) -> asyncio.Future[Stored] | None:
        sink = _sink(then)
        self._merging.setdefault((msgs[0].topic, msgs[0].queue_id), []).append((msgs, queue_id, sync, sink))
        self._submit_soon()
        return sink if then is None else None  # type: ignore[return-value]

    def _submit_soon(self) -> None:
        """Append once the other requests of this read have been handled (they may be merged with this one),
        in this loop iteration; outside a read, in the next iteration (after the other ready callbacks)."""
        if not self._submit_scheduled:
            self._submit_scheduled = True
            if not after_read(self._submit):
                asyncio.get_running_loop().call_soon(self._submit)

    def _submit(self) -> None:
        if not self._submit_scheduled:  # run early by this iteration's _dispatch
            return
        self._submit_scheduled = False
        merging, self._merging = self._merging, {}
        durable, self._durable = self._durable, []
        batch = begin_writes()  # the pull answers and the replies given below leave in one write each
        now: list[_Reply] = []  # answered in this call (not waiting for an fsync), after the dispatch
        now_outcomes: list[_Outcome] = []
        try:
            for group in merging.values():
                for chunk in self._chunks(group):
                    self.jobs += 1
                    self.requests += len(chunk)
                    outcomes = self._append([m for m, *_ in chunk])
                    for (_, qid, sync, fut), outcome in zip(chunk, outcomes):
                        if sync and not isinstance(outcome, BaseException):
                            durable.append(((fut, qid), outcome))
                        else:
                            now.append((fut, qid))
                            now_outcomes.append(outcome)
            if durable:
                replies = [r for r, _ in durable]
                outcomes = [o for _, o in durable]
                ends = [o[-1].commitlog_offset + o[-1].size for o in outcomes if o]  # type: ignore[index]
                if not ends:
                    now += replies
                    now_outcomes += outcomes
                else:
                    waiter = self._waiter
                    if waiter is None:
                        waiter = self._waiter = DurableWaiter(self.store, asyncio.get_running_loop(), _confirm)
                    waiter.wait(max(ends), (replies, outcomes))
            # After asking for the durable wait (its fsync runs off the loop meanwhile), and before the replies,
            # so a sender that has its reply finds its message visible: dispatch, and answer the pulls it woke.
            # Their answers go first in the write batch (a consumer waits for them; a sender of an
            # asynchronous-flush send has its reply in the same loop iteration). A reply awaited by a task (a
            # future, not a callback) is written by that task in the next iteration. The key index, which
            # neither needs, is built once the batch is written (below), still in this call.
            self.dispatch_now(index_later=True)
        finally:
            try:
                _deliver(now, now_outcomes)
            finally:
                end_writes(batch)
                self.index_deferred()

    def close(self) -> None:
        """Stop the fsync thread once what it was asked for is durable (the broker's stop, before the store's)."""
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None

    def _chunks(self, group: list[_Waiting]) -> list[list[_Waiting]]:
        out: list[list[_Waiting]] = []
        cur: list[_Waiting] = []
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
        m = requests[0][0]
        topic, qid = m.topic, m.queue_id
        if len(requests) == 1:
            try:
                return [self._write(topic, qid, requests[0])]
            except Exception as exc:
                return [exc]
        merged = [m for msgs in requests for m in msgs]
        try:
            results = self._write(topic, qid, merged)
        except Exception:
            # Any error of one request (a message the store refuses or the encoder cannot take) is that
            # request's alone: the store encodes and validates the whole call before writing anything.
            out: list[_Outcome] = []
            for msgs in requests:
                try:
                    out.append(self._write(topic, qid, msgs))
                except Exception as exc:
                    out.append(exc)
            return out
        out2: list[_Outcome] = []
        pos = 0
        for msgs in requests:
            out2.append(results[pos:pos + len(msgs)])
            pos += len(msgs)
        return out2


def _sink(then: Then | None) -> _Sink:
    return asyncio.get_running_loop().create_future() if then is None else _Callback(then)


def _deliver(replies: list[_Reply], outcomes: list[_Outcome]) -> None:
    for (fut, qid), outcome in zip(replies, outcomes):
        if fut.done():  # the request was cancelled (its connection closed) meanwhile
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result((qid, outcome))


def _confirm(groups: list[tuple[list[_Reply], list[_Outcome]]], error: BaseException | None) -> None:
    """The group commit covered these iterations' appends (or failed: each of their requests gets the error).
    What the callbacks write leaves here, in one write per connection, not at the loop's next iteration."""
    batch = begin_writes()
    try:
        for replies, outcomes in groups:
            _deliver(replies, outcomes if error is None else [o if isinstance(o, BaseException) else error
                                                              for o in outcomes])
    finally:
        end_writes(batch)
