"""Transactional producers (RocketMQ's TransactionMQProducer), on the wire as the Java client.

``send_in_transaction`` sends a half message (TRAN_MSG=true, PGROUP, sysflag 0x4), runs the local
transaction, then ends it with END_TRANSACTION (37) oneway: commit, rollback, or unknown (the broker asks
later). A broker asks with CHECK_TRANSACTION_STATE (39) about a half message left undecided; the
producer of that group in this client instance answers with ``check`` and END_TRANSACTION
(DefaultMQProducerImpl.sendMessageInTransaction / checkTransactionState / endTransaction).

``execute`` and ``check`` may be plain functions (run on a worker thread, so a slow local transaction does
not stall the client's event loop) or coroutine functions (awaited).
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

from sluice.client.facade import Producer
from sluice.client.instance import ClientInstance
from sluice.client.producer import AsyncProducer
from sluice.client.results import SendResult, SendStatus
from sluice.errors import ClientError, InvalidParameterError, MessageIllegalError, SluiceError
from sluice.format import FLAG_TRANSACTION_PREPARED
from sluice.message import Message, MessageExt
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from sluice.protocol.msgid import decode_offset_msg_id
from sluice.protocol.record import decode_record
from sluice.protocol.trace import MsgType
from sluice.transport.connection import RemotingConnection

__all__ = ["AsyncTransactionProducer", "LocalTransactionState", "TransactionProducer", "TransactionSendResult"]

log = logging.getLogger(__name__)

_DELAYS = (P.DELAY, P.TIMER_DELIVER_MS, P.TIMER_DELAY_MS, P.TIMER_DELAY_SEC)


class LocalTransactionState(enum.Enum):
    """LocalTransactionState.java; the value is END_TRANSACTION's commitOrRollback."""

    COMMIT_MESSAGE = 8
    ROLLBACK_MESSAGE = 12
    UNKNOW = 0  # RocketMQ's spelling


@dataclasses.dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """The half message's send result and the local transaction's outcome (TransactionSendResult.java)."""

    transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


Execute = Callable[[Message, Any], Any]
Check = Callable[[MessageExt], Any]


async def _call(fn: Callable[..., Any], *args: Any) -> LocalTransactionState:
    if inspect.iscoroutinefunction(fn):
        state = await fn(*args)
    else:
        state = await asyncio.to_thread(fn, *args)
        if inspect.isawaitable(state):
            state = await state
    if not isinstance(state, LocalTransactionState):
        raise ClientError(f"{getattr(fn, '__name__', fn)} returned {state!r}, not a LocalTransactionState")
    return state


class AsyncTransactionProducer(AsyncProducer):
    """``AsyncTransactionProducer("group", namesrv=..., execute=fn(msg, arg), check=fn(msg))``; both return
    a :class:`LocalTransactionState`. Other options as :class:`AsyncProducer`."""

    def __init__(self, group: str, namesrv: str | Iterable[str], *, execute: Execute, check: Check,
                 **options: Any) -> None:
        if not callable(execute) or not callable(check):
            raise InvalidParameterError("execute and check must be callables returning a LocalTransactionState")
        super().__init__(group, namesrv, **options)
        self.execute = execute
        self.check = check

    async def start(self) -> None:
        await super().start()
        _CheckService.of(self.instance).producers[self.group] = self

    async def shutdown(self) -> None:
        inst = self._instance
        if inst is not None:
            svc = _CheckService.of(inst)
            if svc.producers.get(self.group) is self:
                del svc.producers[self.group]
        await super().shutdown()

    async def send_in_transaction(self, msg: Message, arg: Any = None, *,
                                  timeout: float | None = None) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``execute(msg, arg)``, end the transaction with its state.

        The send's errors raise (nothing was stored); a failed local transaction (it raised) is left
        UNKNOW, for the broker's check, as the Java client does."""
        prepared = self._prepare(msg)
        props = P.decode_properties(prepared.properties)
        if any(k in props for k in _DELAYS):
            raise MessageIllegalError("a transactional message cannot be delayed (delay_level, deliver_at, delay)")
        props[P.TRAN_MSG] = "true"
        props[P.PGROUP] = self.group
        prepared = dataclasses.replace(prepared, properties=P.encode_properties(props),
                                       sys_flag=prepared.sys_flag | FLAG_TRANSACTION_PREPARED)
        sending = self._dispatch(prepared, msg, timeout, None, None, None, oneway=False)
        trace = self.trace
        sent = await (sending if trace is None else trace.traced_send(self, msg, sending, MsgType.Trans_Msg_Half))
        assert sent is not None
        state = LocalTransactionState.ROLLBACK_MESSAGE
        remark = None
        if sent.status is SendStatus.SEND_OK:
            try:
                state = await _call(self.execute, msg, arg)
            except Exception as exc:
                log.warning("local transaction of %s raised; left UNKNOW for the broker's check", sent.msg_id,
                            exc_info=True)
                state, remark = LocalTransactionState.UNKNOW, f"executeLocalTransactionBranch exception: {exc!r}"
        addr = self.instance.find_broker_addr(sent.queue.broker_name)
        if addr is None:
            raise ClientError(f"broker {sent.queue.broker_name!r} has no known master address")
        header = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=sent.queue_offset,
            commit_log_offset=decode_offset_msg_id(sent.offset_msg_id).offset, commit_or_rollback=state.value,
            from_transaction_check=False, msg_id=sent.msg_id, transaction_id=sent.transaction_id)
        req = RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext(), oneway=True)
        if remark:  # the Java client's remark: the broker logs it
            req = dataclasses.replace(req, remark=remark)
        if trace is not None:  # endTransaction: the hook runs before the oneway; transactionId is the UNIQ_KEY
            trace.end_transaction(self.group, msg, sent.msg_id, sent.msg_id if sent.status is SendStatus.SEND_OK
                                  else "null", state.name, False, addr)
        try:
            await self.instance.remoting.invoke_oneway(addr, req)
        except SluiceError as exc:  # the broker's check resolves it later
            log.warning("END_TRANSACTION for %s to %s failed (%s); the broker will check", sent.msg_id, addr, exc)
        fields = {f.name: getattr(sent, f.name) for f in dataclasses.fields(SendResult)}
        return TransactionSendResult(**fields, transaction_state=state)

    async def answer_check(self, addr: str, header: CheckTransactionStateRequestHeader, msg: MessageExt) -> None:
        """Run ``check`` for a half message the broker asked about and tell the broker."""
        try:
            state = await _call(self.check, msg)
        except Exception:
            log.warning("transaction check of %s raised; answering UNKNOW", header.msg_id, exc_info=True)
            state = LocalTransactionState.UNKNOW
        unique_key = msg.properties.get(P.UNIQ_KEY)
        end = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset, commit_or_rollback=state.value,
            from_transaction_check=True, msg_id=unique_key or msg.offset_msg_id,
            transaction_id=header.transaction_id)
        if self.trace is not None:  # checkTransactionState: the message's transactionId is its UNIQ_KEY
            self.trace.end_transaction(self.group, msg, end.msg_id, unique_key or header.transaction_id or "null",
                                       state.name, True, addr)
        await self.instance.remoting.invoke_oneway(
            addr, RemotingCommand.request(RequestCode.END_TRANSACTION, end.to_ext(), oneway=True))


class _CheckService:
    """One per client instance: routes CHECK_TRANSACTION_STATE to the transaction producer of the group
    (ClientRemotingProcessor.checkTransactionState)."""

    def __init__(self, inst: ClientInstance) -> None:
        self.inst = inst
        self.producers: dict[str, AsyncTransactionProducer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        inst.remoting.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    @classmethod
    def of(cls, inst: ClientInstance) -> _CheckService:
        return inst.service(cls, cls)

    async def _on_check(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        try:
            header = CheckTransactionStateRequestHeader.from_command(request)
            msg = MessageExt.from_record(decode_record(request.body or b"", check_crc=False))
        except SluiceError as exc:
            log.warning("ignoring a malformed CHECK_TRANSACTION_STATE from %s: %s", conn.peer, exc)
            return None
        group = msg.properties.get(P.PGROUP, "")
        producer = self.producers.get(group)
        if producer is None:
            log.warning("broker %s checks a transaction of group %r, which has no transaction producer here",
                        conn.peer, group)
            return None
        addr = self.inst.remoting.address_of(conn) or conn.peer
        task = asyncio.get_running_loop().create_task(producer.answer_check(addr, header, msg))
        self._tasks.add(task)  # the check may be slow: the connection keeps reading meanwhile
        task.add_done_callback(self._done)
        return None

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("answering a transaction check failed: %s", task.exception())


class TransactionProducer(Producer):
    """``with TransactionProducer("group", namesrv=..., execute=fn, check=fn) as p:
    p.send_in_transaction(Message("T", b"..."), arg)``: the blocking twin of AsyncTransactionProducer."""

    def __init__(self, group: str, namesrv: str | Iterable[str], *, execute: Execute, check: Check,
                 **options: Any) -> None:
        super(Producer, self).__init__()  # the facade's loop bookkeeping, with a transactional implementation
        self._impl = AsyncTransactionProducer(group, namesrv, execute=execute, check=check, **options)

    def send_in_transaction(self, msg: Message, arg: Any = None, *,
                            timeout: float | None = None) -> TransactionSendResult:
        impl: AsyncTransactionProducer = self._impl  # type: ignore[assignment]
        # The local transaction's own time comes on top of the send's: the outer wait only guards a wedged loop.
        return self._run(impl.send_in_transaction(msg, arg, timeout=timeout), self._timeout(timeout) + 3600)
