"""Broker requests a client makes (MQClientAPIImpl), async over one RemotingClient.

Each call takes the broker address, builds the request from the typed
headers, and raises the sluice.errors class of an error response (with the
broker's remark). Decoding stored records is left to the callers.
"""
from __future__ import annotations

import zlib

from sluice.errors import SluiceError
from sluice.message import MessageExt
from sluice.protocol import headers as H
from sluice.protocol.bodies import HeartbeatData, encode_body
from sluice.transport.client import RemotingClient
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.record import iter_records
from sluice.format import crc32
from sluice.speedups import C, check_message_ext
from sluice.client.results import MessageQueue

check_message_ext(MessageExt)  # C's decode_messages sets these slots: a renamed one must fail here, not go slow

__all__ = ["BrokerAPI", "decode_messages"]


def decode_messages(body: bytes, *, check_crc: bool = True, extra: dict[str, str] | None = None) -> list[MessageExt]:
    """Stored records laid back to back (pull, view and query bodies) to MessageExt, bodies inflated,
    ``extra`` set in every message's properties (a pull's MIN_OFFSET and MAX_OFFSET).

    In C where built (speedups.decode_messages); anything it does not take
    (IPv6 hosts, a record that does not decode) goes through the Python decoder and its errors."""
    if C is not None:
        msgs = C.decode_messages(body, check_crc, crc32, MessageExt, zlib.decompress, extra)
        if msgs is not None:
            return msgs
    msgs = [MessageExt.from_record(rec) for rec in iter_records(body, check_crc=check_crc)]
    if extra:
        for m in msgs:
            m.properties.update(extra)
    return msgs


class BrokerAPI:
    def __init__(self, remoting: RemotingClient) -> None:
        self.remoting = remoting

    async def invoke(self, addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """The response if it is SUCCESS, else the matching error is raised."""
        return (await self.remoting.invoke(addr, request, timeout)).raise_for_code()

    async def heartbeat(self, addr: str, data: HeartbeatData, timeout: float) -> None:
        await self.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=encode_body(data)), timeout)

    async def unregister_client(self, addr: str, client_id: str, *, producer_group: str | None = None,
                                consumer_group: str | None = None, timeout: float = 3.0) -> None:
        header = H.UnregisterClientRequestHeader(client_id=client_id, producer_group=producer_group,
                                                 consumer_group=consumer_group)
        await self.invoke(addr, RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, header.to_ext()), timeout)

    # ---------------------------------------------------------------------------------- offsets

    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue, timeout: float) -> int:
        """The committed offset, or -1 when the broker has none (QUERY_NOT_FOUND)."""
        header = H.QueryConsumerOffsetRequestHeader(consumer_group=group, topic=mq.topic, queue_id=mq.queue_id)
        try:
            resp = await self.invoke(
                addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext()), timeout)
        except SluiceError as exc:
            if exc.code == ResponseCode.QUERY_NOT_FOUND:
                return -1
            raise
        return H.QueryConsumerOffsetResponseHeader.from_command(resp).offset

    async def update_consumer_offset(self, addr: str, group: str, mq: MessageQueue, offset: int,
                                     timeout: float) -> None:
        header = H.UpdateConsumerOffsetRequestHeader(consumer_group=group, topic=mq.topic, queue_id=mq.queue_id,
                                                     commit_offset=offset)
        await self.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext()), timeout)

    async def _offset(self, addr: str, code: RequestCode, header: H.Header, timeout: float) -> int:
        resp = await self.invoke(addr, RemotingCommand.request(code, header.to_ext()), timeout)
        return H.OffsetResponseHeader.from_command(resp).offset

    async def max_offset(self, addr: str, mq: MessageQueue, timeout: float) -> int:
        return await self._offset(addr, RequestCode.GET_MAX_OFFSET,
                                  H.GetMaxOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id), timeout)

    async def min_offset(self, addr: str, mq: MessageQueue, timeout: float) -> int:
        return await self._offset(addr, RequestCode.GET_MIN_OFFSET,
                                  H.GetMinOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id), timeout)

    async def search_offset(self, addr: str, mq: MessageQueue, timestamp_ms: int, timeout: float) -> int:
        header = H.SearchOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp_ms)
        return await self._offset(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header, timeout)

    async def earliest_msg_store_time(self, addr: str, mq: MessageQueue, timeout: float) -> int:
        header = H.GetEarliestMsgStoretimeRequestHeader(topic=mq.topic, queue_id=mq.queue_id)
        resp = await self.invoke(addr, RemotingCommand.request(RequestCode.GET_EARLIEST_MSG_STORETIME,
                                                               header.to_ext()), timeout)
        return H.GetEarliestMsgStoretimeResponseHeader.from_command(resp).timestamp

    # ---------------------------------------------------------------------------------- lookups

    async def view_message(self, addr: str, commitlog_offset: int, timeout: float,
                           topic: str | None = None) -> bytes:
        header = H.ViewMessageRequestHeader(offset=commitlog_offset, topic=topic)
        resp = await self.invoke(addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, header.to_ext()),
                                 timeout)
        return resp.body

    async def query_message(self, addr: str, header: H.QueryMessageRequestHeader, *, unique_key: bool,
                            timeout: float) -> bytes:
        """The stored records the broker's key index found (b"" for QUERY_NOT_FOUND)."""
        ext = header.to_ext()
        ext["_UNIQUE_KEY_QUERY"] = "true" if unique_key else "false"
        try:
            resp = await self.invoke(addr, RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext), timeout)
        except SluiceError as exc:
            if exc.code == ResponseCode.QUERY_NOT_FOUND:
                return b""
            raise
        return resp.body
