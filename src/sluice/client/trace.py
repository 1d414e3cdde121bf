"""Message trace in the SDK (``enable_trace=True``): Pub, SubBefore, SubAfter and EndTransaction records sent to
the trace topic.

As RocketMQ's client does (client/src/main/java/org/apache/rocketmq/client/trace/AsyncTraceDispatcher.java,
hook/SendMessageTraceHookImpl.java, hook/EndTransactionTraceHookImpl.java, hook/ConsumeMessageTraceHookImpl.java,
and where DefaultMQProducerImpl.sendKernelImpl / endTransaction / checkTransactionState call them, 4.9.8):

- a producer records a Pub after each send the broker answered: ``send`` (any queue choice; ``send_async``),
  ``request`` and a transactional half message (msgType Trans_Msg_Half) alike (topic, msgId, offsetMsgId,
  tags, keys, store host, body length, cost, success, message type). Failed sends are not traced, and neither
  are oneway sends: Java's hook returns early without a send result, and there is none;
- a batch is traced as one Pub line per message, each in RocketMQ's Pub layout with that message's ids, tags,
  keys and body length and the batch's cost. RocketMQ writes one line for the whole batch whose msgId and
  offsetMsgId are the comma-joined lists and whose tags and keys are null; keyed by that joined list, it is
  found by no single message's id, neither by mqadmin's queryMsgTraceById nor by the dashboard, so a batch's
  messages show no Pub there. Lines per message are found by both;
- a transactional producer records an EndTransaction when it ends a transaction, after its local transaction
  or answering the broker's check (state, transactionId, fromTransactionCheck; msgType Trans_msg_Commit as
  Java writes it whatever the state);
- a push consumer records a SubBefore for each listener call (group, one line per message: msgId, retry
  times, keys) and a SubAfter after it (cost per message, success, ConsumeReturnType as the context code);
  a lite pull consumer the same around each poll that returns messages; messages whose ``TRACE_ON``
  property is ``false`` are left out;
- records go into a bounded queue that never blocks: when it is full the record is dropped, counted in
  :attr:`TraceDispatcher.dropped`, and logged at most once a minute. A task on the client's loop takes
  what is queued every ``flush_interval`` seconds, or as soon as the queue is half full, and sends it with
  an inner producer (group ``_INNER_TRACE_PRODUCER``, a client instance of its own) as messages of the
  trace topic whose keys are the traced msgIds and keys: per 100 records, grouped by the traced topic and
  packed up to 118,000 bytes (and keys within the properties' limit), as AsyncTraceDispatcher.flushData
  packs them, all sent at once. ``shutdown`` sends what is still queued.

Listener calls (and so SubBefore / SubAfter) run on the consumer's thread pool: the queue is a deque,
whose append is atomic, and appending never waits (one thread-safe wake-up when it reaches half full).
"""
from __future__ import annotations

import asyncio
import logging
import collections
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sluice.errors import SluiceError
from sluice.message import Message, MessageExt
from sluice.protocol import properties as P
from sluice.protocol.msgid import new_unique_id
from sluice.protocol.properties import MAX_PROPERTIES_BYTES
from sluice.protocol.trace import (DEFAULT_REGION, ConsumeReturnType, MsgType, TraceBean, TraceContext, TraceType,
                                   encode_context)

if TYPE_CHECKING:
    from sluice.client.instance import ClientInstance
    from sluice.client.results import SendResult

__all__ = ["TraceDispatcher", "TraceSender", "TracedProducer"]

log = logging.getLogger(__name__)

#: Records queued at most. AsyncTraceDispatcher's traceContextQueue holds 1024, but its worker moves them on at
#: once, in batches of 100, into an executor queue of 2048 batches its sender threads work off: it holds about
#: 200,000 before dropping. Here the one queue is what waits for the sender; 16384 rides out a consumer catching
#: up on a backlog (two records per listener call) in a few MB.
QUEUE_SIZE = 16384
#: A trace message carries the records of at most 100 (AsyncTraceDispatcher's batchSize) and stays under
#: maxMsgSize - 10 * 1000 = 118,000 bytes.
BATCH_SIZE = 100
MAX_MESSAGE_SIZE = 118_000
#: A trace message's keys (space-joined in its KEYS property) stay under this many characters, leaving room in the
#: properties' signed-short length for the others; a batch's records can carry thousands of msgIds.
MAX_KEYS_CHARS = MAX_PROPERTIES_BYTES - 2_000
#: Drops and send failures are logged at most this often.
LOG_INTERVAL_S = 60.0


class TraceSender(Protocol):
    """The inner producer (sluice.client.producer.started_trace makes it; this module cannot import it)."""

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def send(self, msg: Message) -> Any: ...


class TracedProducer(Protocol):
    """What a Pub record needs of the producer that sent (AsyncProducer; this module cannot import it)."""

    @property
    def group(self) -> str: ...

    @property
    def instance(self) -> ClientInstance: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


def _tags_keys(props: dict[str, str]) -> tuple[str, str]:
    """A message's tags and keys as Java appends them: ``null`` when it has none."""
    return props.get(P.TAGS, "null"), props.get(P.KEYS, "null")


class TraceDispatcher:
    """One traced client's trace records: :meth:`append` from any thread, sent in the background."""

    def __init__(self, sender: TraceSender, topic: str, *, queue_size: int = QUEUE_SIZE,
                 flush_interval: float = 0.05) -> None:
        self.topic = topic
        self.flush_interval = flush_interval
        self._sender = sender
        # A deque's append and popleft are atomic under the GIL, without the locks of queue.Queue; the bound
        # is checked before appending, so threads racing past it overshoot it by at most one record each.
        self._queue: collections.deque[TraceContext] = collections.deque()
        self._max = queue_size
        self._producer: TraceSender | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        #: Records dropped because the queue was full.
        self.dropped = 0
        #: Trace messages sent, and those whose send failed.
        self.sent = 0
        self.failed = 0
        self._logged_at = float("-inf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._wake_pending = False
        self._wake_at = max(1, queue_size // 2)
        self._stopping = False

    # ------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the inner producer and the sending task."""
        await self._sender.start()
        self._producer = self._sender
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sluice-trace")

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Send what is queued (for at most ``timeout`` seconds), then stop the inner producer."""
        task, self._task = self._task, None
        producer, self._producer = self._producer, None
        self._loop = None
        try:
            async with asyncio.timeout(timeout):
                if task is not None and not task.done():  # its last round sends what is queued, nothing cut off
                    self._stopping = True
                    self._wake_set()
                    await asyncio.shield(task)
                while producer is not None and self._queue:
                    await self._flush(producer)
        except TimeoutError:
            log.warning("%d trace record(s) still queued after %.1f s at shutdown were not sent",
                        len(self._queue), timeout)
        finally:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if producer is not None:
                await producer.shutdown()

    # ------------------------------------------------------------------------------ recording

    def append(self, ctx: TraceContext) -> bool:
        """Queue a record without blocking; False (and counted) when the queue is full."""
        q = self._queue
        if len(q) >= self._max:
            with self._lock:
                self.dropped += 1
                dropped = self.dropped
            self._log_rarely("trace queue full: %d trace record(s) dropped so far", dropped)
            return False
        q.append(ctx)
        if len(q) >= self._wake_at and not self._wake_pending and self._loop is not None:
            # Half full: the sender starts now rather than at its next round.
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._wake_set)
        return True

    def pub(self, group: str, msg: Message, result: SendResult, begin_ms: int, store_host: str,
            msg_type: MsgType | None = None) -> None:
        """SendMessageTraceHookImpl: the Pub record of a send the broker answered. ``msg_type`` defaults to
        sendKernelImpl's choice: Delay_Msg for a delay level, else Normal_Msg."""
        props = msg.all_properties()
        if msg_type is None:
            msg_type = MsgType.Delay_Msg if P.DELAY in props else MsgType.Normal_Msg
        tags, keys = _tags_keys(props)
        bean = TraceBean(topic=msg.topic, msg_id=result.msg_id, offset_msg_id=result.offset_msg_id, tags=tags,
                         keys=keys, store_host=store_host, body_length=len(msg.body), msg_type=msg_type)
        self.append(TraceContext(TraceType.Pub, timestamp=begin_ms, region_id=DEFAULT_REGION, group=group,
                                 cost_time=_now_ms() - begin_ms, success=result.status.value == "SEND_OK",
                                 beans=[bean]))

    def pub_batch(self, group: str, msgs: Sequence[Message], result: SendResult, begin_ms: int,
                  store_host: str) -> None:
        """The Pub records of a batch the broker answered: one per message (see the module's docstring)."""
        ids, offset_ids = result.msg_ids, result.offset_msg_ids
        if len(ids) != len(msgs) or len(offset_ids) != len(msgs):
            raise ValueError(f"a batch of {len(msgs)} message(s) answered with {len(ids)} msgId(s) and "
                             f"{len(offset_ids)} offsetMsgId(s)")
        cost = _now_ms() - begin_ms
        success = result.status.value == "SEND_OK"
        append = self.append
        for msg, msg_id, offset_id in zip(msgs, ids, offset_ids):
            # The TAGS and KEYS all_properties() would give, without copying the user properties per message.
            bean = TraceBean(topic=msg.topic, msg_id=msg_id, offset_msg_id=offset_id, tags=msg.tags or "null",
                             keys=P.KEY_SEPARATOR.join(msg.key_list()) or "null", store_host=store_host,
                             body_length=len(msg.body))
            append(TraceContext(TraceType.Pub, timestamp=begin_ms, region_id=DEFAULT_REGION, group=group,
                                cost_time=cost, success=success, beans=[bean]))

    async def traced_send(self, producer: TracedProducer, msg: Message | Sequence[Message],
                          sending: Awaitable[SendResult | None], msg_type: MsgType | None = None) -> SendResult:
        """Await ``sending`` (the send of ``msg``, or of the batch ``msg``) and record its Pub records, as
        sendKernelImpl runs the send hooks around its send. A send that raises records nothing; a record that
        cannot be made is logged (rarely): tracing never fails a send the broker stored."""
        begin = _now_ms()
        result = await sending
        assert result is not None  # not oneway: those are never traced
        try:
            addr = producer.instance.find_broker_addr(result.queue.broker_name) or ""
            if isinstance(msg, Message):
                if not msg.topic.startswith(self.topic):  # the trace data itself is not traced
                    self.pub(producer.group, msg, result, begin, addr, msg_type)
            elif msg and not msg[0].topic.startswith(self.topic):
                self.pub_batch(producer.group, msg, result, begin, addr)
        except Exception as exc:
            self._log_rarely("Pub trace record of %s not made: %r", result.msg_id, exc)
        return result

    def end_transaction(self, group: str, msg: Message | MessageExt, msg_id: str, transaction_id: str,
                        state: str, from_check: bool, store_host: str) -> None:
        """EndTransactionTraceHookImpl: the EndTransaction record of a transaction this producer ended (``state``
        a LocalTransactionState name). Tracing never fails the transaction: a record that cannot be made is
        logged (rarely) and left out."""
        try:
            props = msg.properties if isinstance(msg, MessageExt) else msg.all_properties()
            if msg.topic.startswith(self.topic):
                return
            tags, keys = _tags_keys(props)
            bean = TraceBean(topic=msg.topic, msg_id=msg_id, tags=tags, keys=keys, store_host=store_host,
                             msg_type=MsgType.Trans_msg_Commit, transaction_id=transaction_id,
                             transaction_state=state, from_transaction_check=from_check)
            self.append(TraceContext(TraceType.EndTransaction, timestamp=_now_ms(),
                                     region_id=props.get(P.MSG_REGION) or DEFAULT_REGION, group=group,
                                     beans=[bean]))
        except Exception as exc:
            self._log_rarely("EndTransaction trace record of %s not made: %r", msg_id, exc)

    def sub_before(self, group: str, msgs: Iterable[MessageExt]) -> TraceContext | None:
        """ConsumeMessageTraceHookImpl.consumeMessageBefore: queued, and returned for :meth:`sub_after`
        (None when every message has tracing switched off)."""
        beans = []
        region = DEFAULT_REGION
        for m in msgs:
            props = m.properties
            if props.get(P.TRACE_ON) == "false":
                continue
            region = props.get(P.MSG_REGION, region)
            beans.append(TraceBean(topic=m.topic, msg_id=m.msg_id, tags=props.get(P.TAGS, "null"),
                                   keys=props.get(P.KEYS, "null"), body_length=m.store_size,
                                   retry_times=m.reconsume_times))
        if not beans:
            return None
        ctx = TraceContext(TraceType.SubBefore, timestamp=_now_ms(), region_id=region, group=group,
                           request_id=new_unique_id(), beans=beans)
        self.append(ctx)
        return ctx

    def sub_after(self, before: TraceContext, outcome: ConsumeReturnType, count: int) -> None:
        """ConsumeMessageTraceHookImpl.consumeMessageAfter: cost per message of the listener call."""
        now = _now_ms()
        self.append(TraceContext(TraceType.SubAfter, timestamp=now, region_id=before.region_id, group=before.group,
                                 request_id=before.request_id, cost_time=(now - before.timestamp) // max(count, 1),
                                 success=outcome is ConsumeReturnType.SUCCESS, context_code=int(outcome),
                                 beans=before.beans))

    def traced_call(self, group: str, call: Callable[[list[MessageExt]], ConsumeReturnType],
                    msgs: list[MessageExt]) -> bool:
        """Run one listener call between its SubBefore and SubAfter; True for success. A record that cannot
        be made is logged (rarely) and left out: tracing never changes what is consumed."""
        try:
            before = self.sub_before(group, msgs)
        except Exception as exc:
            self._log_rarely("SubBefore trace record not made: %r", exc)
            before = None
        outcome = call(msgs)
        if before is not None:
            try:
                self.sub_after(before, outcome, len(msgs))
            except Exception as exc:
                self._log_rarely("SubAfter trace record not made: %r", exc)
        return outcome is ConsumeReturnType.SUCCESS

    # ------------------------------------------------------------------------------ sending

    def _wake_set(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _log_rarely(self, fmt: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_INTERVAL_S:
            self._logged_at = now
            log.warning(fmt, *args)

    async def _run(self) -> None:
        producer = self._producer
        assert producer is not None and self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            self._wake_pending = False
            while self._queue:
                await self._flush(producer)
            if self._stopping:
                return

    def _take(self) -> list[TraceContext]:
        q = self._queue
        return [q.popleft() for _ in range(len(q))]  # only this task takes: len() is a lower bound

    async def _flush(self, producer: TraceSender) -> None:
        """Send what is queued: per BATCH_SIZE records (AsyncTraceDispatcher's AsyncAppenderRequest), grouped
        by traced topic and packed into messages; all of them sent at once."""
        taken = self._take()
        messages = []
        for i in range(0, len(taken), BATCH_SIZE):
            messages += self._pack(taken[i:i + BATCH_SIZE])
        results = await asyncio.gather(*(producer.send(m) for m in messages), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                self.failed += 1
                self._log_rarely("sending trace data to %s failed: %s", self.topic, r)
            else:
                self.sent += 1

    def _pack(self, contexts: list[TraceContext]) -> list[Message]:
        by_topic: dict[str, list[tuple[str, list[str]]]] = {}
        for ctx in contexts:
            try:
                encoded = encode_context(ctx)
            except SluiceError as exc:
                self._log_rarely("trace record not sent: %s", exc)
                continue
            by_topic.setdefault(ctx.beans[0].topic, []).append(encoded)
        messages = []
        for encoded in by_topic.values():
            data: list[str] = []
            size = 0
            keys: dict[str, None] = {}
            key_chars = 0
            for text, ks in encoded:
                grown = sum(len(k) + 1 for k in ks if k not in keys)
                if data and key_chars + grown > MAX_KEYS_CHARS:
                    messages.append(Message(self.topic, "".join(data).encode(), keys=list(keys)))
                    data, size, keys, key_chars = [], 0, {}, 0
                    grown = sum(len(k) + 1 for k in dict.fromkeys(ks))
                data.append(text)
                size += len(text)
                keys.update(dict.fromkeys(ks))
                key_chars += grown
                if size >= MAX_MESSAGE_SIZE:
                    messages.append(Message(self.topic, "".join(data).encode(), keys=list(keys)))
                    data, size, keys, key_chars = [], 0, {}, 0
            if data:
                messages.append(Message(self.topic, "".join(data).encode(), keys=list(keys)))
        return messages
