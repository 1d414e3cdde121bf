"""Broker requests only push consumers make: the group's member list, orderly queue locks, send-back.

Thin async functions over :class:`sluice.client.broker_api.BrokerAPI` (which raises the
sluice.errors class of any error answer).
"""
from __future__ import annotations

from collections.abc import Iterable

from sluice.client.broker_api import BrokerAPI
from sluice.client.results import MessageQueue
from sluice.message import MessageExt
from sluice.protocol import headers as H
from sluice.protocol.bodies import (
    ConsumerListBody, LockBatchRequestBody, LockBatchResponseBody, UnlockBatchRequestBody, decode_body, encode_body,
)
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand

__all__ = ["PullTemplate", "consumer_id_list", "lock_batch", "send_message_back", "store_addr", "unlock_batch"]


class PullTemplate:
    """A queue's PULL_MESSAGE extFields with the fields fixed while its subscription stays (group, topic, queue,
    expression and type, sub_version, suspend and scan limits) rendered once: :meth:`ext` sets the four that
    change per pull, so a pull costs no header dataclass and no to_ext. ``sub`` is the (selector, version)
    it was built for; the owner builds a new one when its subscription entry is another object."""

    __slots__ = ("_ext", "sub")

    def __init__(self, header: H.PullMessageRequestHeader, sub: object) -> None:
        self._ext = header.to_ext()  # every field in header order; the per-pull ones are overwritten in place
        self.sub = sub

    def ext(self, queue_offset: int, max_msg_nums: int, sys_flag: int, commit_offset: int) -> dict[str, str]:
        """What ``dataclasses.replace(header, ...).to_ext()`` gives with these four fields."""
        ext = self._ext.copy()
        ext["queueOffset"] = str(queue_offset)
        ext["maxMsgNums"] = str(max_msg_nums)
        ext["sysFlag"] = str(sys_flag)
        ext["commitOffset"] = str(commit_offset)
        return ext


async def consumer_id_list(api: BrokerAPI, addr: str, group: str, timeout: float) -> list[str]:
    """GET_CONSUMER_LIST_BY_GROUP: the client ids of the group's live members, as this broker sees them."""
    header = H.GetConsumerListByGroupRequestHeader(consumer_group=group)
    resp = await api.invoke(addr, RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header.to_ext()),
                            timeout)
    if not resp.body:
        return []
    return list(decode_body(ConsumerListBody, resp.body).consumer_id_list)


async def lock_batch(api: BrokerAPI, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue],
                     timeout: float) -> set[MessageQueue]:
    """LOCK_BATCH_MQ: lock (or renew) the queues; returns those this client holds now."""
    body = LockBatchRequestBody(consumer_group=group, client_id=client_id, mq_set=list(mqs))
    resp = await api.invoke(addr, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=encode_body(body)),
                            timeout)
    if not resp.body:
        return set()
    return set(decode_body(LockBatchResponseBody, resp.body).lock_ok_mq_set)


async def unlock_batch(api: BrokerAPI, addr: str, group: str, client_id: str, mqs: Iterable[MessageQueue],
                       timeout: float) -> None:
    body = UnlockBatchRequestBody(consumer_group=group, client_id=client_id, mq_set=list(mqs))
    await api.invoke(addr, RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=encode_body(body)), timeout)


def store_addr(msg: MessageExt) -> str:
    """The broker that stored ``msg`` (its store host), where a send-back must go."""
    host, port = msg.store_host
    return f"{host}:{port}"


async def send_message_back(api: BrokerAPI, msg: MessageExt, group: str, *, delay_level: int,
                            max_reconsume_times: int | None, timeout: float) -> None:
    """CONSUMER_SEND_MSG_BACK: the broker copies the stored message into %RETRY%<group> (delayed by
    ``delay_level``, 0 = 3 + reconsume times) or, past ``max_reconsume_times`` (None: the group's
    retryMaxTimes) or with a negative level, into %DLQ%<group>. ``msg.topic`` is the original topic (the consumer restored it)."""
    header = H.ConsumerSendMsgBackRequestHeader(
        offset=msg.commitlog_offset, group=group, delay_level=delay_level, origin_msg_id=msg.msg_id,
        origin_topic=msg.topic, max_reconsume_times=max_reconsume_times)
    await api.invoke(store_addr(msg), RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext()),
                     timeout)
