"""Pure send-side encoding: a Message to the bytes and header fields a SEND_MESSAGE(_V2) carries,
a list of Messages to a SEND_BATCH_MESSAGE body, and a send response to a SendResult.

Compression follows DefaultMQProducerImpl.tryToCompressMessage: a single
message's body of ``compress_over`` bytes or more is zlib-compressed at
``level`` and the COMPRESSED sysflag bit set. Batches are never compressed,
as in the Java client (a MessageBatch is excluded there): the batch body
codec has no per-message sysflag, so a compressed entry could not be marked.
"""
from __future__ import annotations

import dataclasses
import functools
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.client.results import MessageQueue, SendResult, SendStatus
from sluice.errors import MessageIllegalError
from sluice.message import Message
from sluice.protocol import fields
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.batch import encode_batch
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import (DEFAULT_VERSION, FLAG_ONEWAY, RemotingCommand, SerializeType, _command,
                                     error_for_response)
from sluice.protocol.msgid import new_unique_id, new_unique_ids
from sluice.protocol.record import check_topic
from sluice.format import FLAG_COMPRESSED
from sluice.speedups import C

__all__ = [
    "DEFAULT_COMPRESS_LEVEL", "DEFAULT_COMPRESS_OVER", "DEFAULT_MAX_MESSAGE_SIZE", "PreparedSend",
    "build_send_request", "parse_send_response", "prepare_batch", "prepare_message",
]

DEFAULT_COMPRESS_OVER = 4096  # compressMsgBodyOverHowmuch
DEFAULT_COMPRESS_LEVEL = 5  # rocketmq.message.compressLevel
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # maxMessageSize

_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


@dataclass(frozen=True, slots=True)
class PreparedSend:
    """What goes on the wire for one send, fixed before the first attempt and reused by retries
    (so the UNIQ_KEY stays the same across attempts)."""

    topic: str
    body: bytes
    properties: str
    sys_flag: int
    flag: int
    msg_id: str  # UNIQ_KEY, or the batch's ids joined by commas
    batch: bool = False
    #: A reply (MSG_TYPE=reply): sent as SEND_REPLY_MESSAGE(_V2) (MQClientAPIImpl.sendMessage's isReply).
    reply: bool = False


_new_object = object.__new__
_SYSTEM_NAMES = P.SYSTEM_NAMES
_TRANSIENT = P.TRANSIENT_PREFIX
assert P.TAGS == "TAGS" and P.UNIQ_KEY == "UNIQ_KEY" and P.NAME_VALUE_SEPARATOR == "\x01" \
    and P.PROPERTY_SEPARATOR == "\x02", "_prepare_plain writes these literally"
_p_topic, _p_body, _p_properties, _p_sys_flag, _p_flag, _p_msg_id, _p_batch, _p_reply = (
    PreparedSend.__dict__[name].__set__ for name in ("topic", "body", "properties", "sys_flag", "flag", "msg_id",
                                                     "batch", "reply"))
assert len(dataclasses.fields(PreparedSend)) == 8, "prepare_message sets every PreparedSend field"


def _with_uniq_key(msg: Message) -> tuple[dict[str, str], str]:
    props = msg.all_properties()
    # MessageClientIDSetter.setUniqID: only when the message does not carry one already.
    uid = props.get(P.UNIQ_KEY) or new_unique_id()
    props[P.UNIQ_KEY] = uid
    return props, uid


def prepare_message(
    msg: Message, *, max_size: int = DEFAULT_MAX_MESSAGE_SIZE, compress_over: int = DEFAULT_COMPRESS_OVER,
    compress_level: int = DEFAULT_COMPRESS_LEVEL,
) -> PreparedSend:
    """Validate (MessageIllegalError for a bad topic, an empty or too large body, bad properties),
    give the message its unique id and compress a large body."""
    if type(msg) is Message:  # the common shape in one pass (_prepare_plain); anything else: the general road
        prepared = _prepare_plain(msg, max_size, compress_over)
        if prepared is not None:
            return prepared
    return _prepare_general(msg, max_size, compress_over, compress_level)


def _prepare_plain(msg: Message, max_size: int, compress_over: int) -> PreparedSend | None:
    """prepare_message for a plain Message of the common shape (str properties and tags, no keys, no delay of
    any kind, a bytes body too small to compress), its checks and its property encoding fused into one pass:
    the same PreparedSend as _prepare_general's (its twin). None when the message is of another shape or
    fails a check: the general road then gives the result or the precise error."""
    topic, body, flag, tags, props = msg.topic, msg.body, msg.flag, msg.tags, msg.properties
    if (type(body) is not bytes or not 0 < len(body) <= max_size or len(body) >= compress_over
            or type(props) is not dict or msg.keys is not None or msg.deliver_at is not None or msg.delay is not None
            or type(msg.delay_level) is not int or msg.delay_level != 0
            or type(flag) is not int or not -0x80000000 <= flag <= 0x7FFFFFFF
            or type(topic) is not str or not _topic_ok(topic)):
        return None
    parts = []
    for name, value in props.items():
        # Names the encoding drops (transient) or the validation refuses go the general road.
        if (type(name) is not str or type(value) is not str or not name or name in _SYSTEM_NAMES
                or name.startswith(_TRANSIENT)):
            return None
        parts.append(f"{name}\x01{value}\x02")
    if tags is not None:
        if type(tags) is not str:
            return None
        if tags:
            parts.append(f"TAGS\x01{tags}\x02")
    uid = new_unique_id()
    parts.append(f"UNIQ_KEY\x01{uid}\x02")
    text = "".join(parts)
    # One separator pair per property: no name or value holds a separator (check_property's rule).
    n = len(parts)
    if text.count("\x01") != n or text.count("\x02") != n:
        return None
    prepared = _new_object(PreparedSend)
    _p_topic(prepared, topic)
    _p_body(prepared, body)
    _p_properties(prepared, text)
    _p_sys_flag(prepared, 0)
    _p_flag(prepared, flag)
    _p_msg_id(prepared, uid)
    _p_batch(prepared, False)
    _p_reply(prepared, False)
    return prepared


def _prepare_general(msg: Message, max_size: int, compress_over: int, compress_level: int) -> PreparedSend:
    """prepare_message for any message: Message.validate, all_properties and encode_properties."""
    msg.validate(max_size)
    props, uid = _with_uniq_key(msg)
    body = bytes(msg.body)
    sys_flag = 0
    if len(body) >= compress_over:
        body = zlib.compress(body, compress_level)
        sys_flag |= FLAG_COMPRESSED
    prepared = _new_object(PreparedSend)  # PreparedSend(...) without the frozen __init__: one per send
    _p_topic(prepared, msg.topic)
    _p_body(prepared, body)
    _p_properties(prepared, P.encode_properties(props))
    _p_sys_flag(prepared, sys_flag)
    _p_flag(prepared, msg.flag)
    _p_msg_id(prepared, uid)
    _p_batch(prepared, False)
    _p_reply(prepared, False)
    return prepared


def prepare_batch(msgs: Sequence[Message], *, max_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> PreparedSend:
    """MessageBatch.generateFromList + encode: one topic, no delayed messages, the whole body within
    ``max_size``. The ids are made in one step; the C encoder builds the body when the extension is built
    and every message has the common shape, else _encode_batch_py (its twin) builds it or raises the error."""
    if not msgs:
        raise MessageIllegalError("a batch needs at least one message")
    msgs = msgs if type(msgs) is list else list(msgs)
    topic = msgs[0].topic
    ids = new_unique_ids(len(msgs))
    body = None
    if C is not None and type(topic) is str and _topic_ok(topic):
        body = C.encode_send_batch(msgs, Message, topic, ids, max_size, P.SYSTEM_NAMES)
    if body is None:
        body = _encode_batch_py(msgs, topic, ids, max_size)
    return PreparedSend(topic, body, "", 0, 0, ",".join(ids), batch=True)


def _encode_batch_py(msgs: Sequence[Message], topic: str, ids: list[str], max_size: int) -> bytes:
    """The batch body with message i's UNIQ_KEY ``ids[i]`` unless it carries its own, which then replaces
    ``ids[i]`` (the reference for C's encode_send_batch, which takes plain Messages only), or the
    MessageIllegalError of the first bad message."""
    entries = []
    for i, m in enumerate(msgs):
        if m.topic != topic:
            raise MessageIllegalError(f"all messages of a batch must have one topic: message {i} is for "
                                      f"{m.topic!r}, message 0 for {topic!r}")
        if m.delay_level > 0:
            raise MessageIllegalError(f"message {i}: delayed messages cannot be sent in a batch")
        m.validate(max_size)
        props = m.all_properties()
        # MessageClientIDSetter.setUniqID: only when the message does not carry one already (validate refuses
        # a UNIQ_KEY among user properties, but a Message subclass may add one, as the Spark writer's
        # content-derived ids do): that id is kept, and reported in ``ids``.
        uid = props.get(P.UNIQ_KEY)
        if uid:
            ids[i] = uid
        else:
            props[P.UNIQ_KEY] = ids[i]
        entries.append((bytes(m.body), props, m.flag))
    body = encode_batch(entries)
    if len(body) > max_size:
        raise MessageIllegalError(f"the batch body is {len(body)} bytes; the limit is {max_size}")
    return body


@functools.lru_cache(maxsize=256)
def _topic_ok(topic: str) -> bool:
    """check_topic as a yes/no, once per topic (the C encoder checks only that every message has this one)."""
    try:
        check_topic(topic)
    except MessageIllegalError:
        return False
    return True


def build_send_request(
    prepared: PreparedSend, mq: MessageQueue, *, group: str, default_topic: str = "TBW102",
    default_topic_queue_nums: int = 4, v2: bool = True, oneway: bool = False,
) -> RemotingCommand:
    """SEND_MESSAGE_V2 (one-letter header) by default, SEND_MESSAGE with ``v2=False``;
    SEND_BATCH_MESSAGE (letters, as Java sends it) for a batch.

    The extFields are written directly (the fields of SendMessageRequestHeader, as its
    ``to_ext`` / ``to_v2_ext`` render them): this runs once per message sent.
    """
    if v2 and not prepared.batch and not prepared.reply:  # a single send, what runs per message: the dict at once
        ext = {"a": group, "b": prepared.topic, "c": default_topic, "d": str(default_topic_queue_nums),
               "e": str(mq.queue_id), "f": str(prepared.sys_flag), "g": str(int(_time() * 1000)),
               "h": str(prepared.flag), "i": prepared.properties, "j": "0", "k": "false", "m": "false",
               "n": mq.broker_name}
        return _request(_SEND_V2, ext, prepared.body, None, 0, FLAG_ONEWAY if oneway else 0, _LANGUAGE,
                        DEFAULT_VERSION, SerializeType.JSON)
    values = (group, prepared.topic, default_topic, str(default_topic_queue_nums), str(mq.queue_id),
              str(prepared.sys_flag), str(int(time.time() * 1000)), str(prepared.flag), prepared.properties, "0",
              "false", "true" if prepared.batch else "false", mq.broker_name)
    if prepared.batch:
        code, names = RequestCode.SEND_BATCH_MESSAGE, _V2_NAMES
    elif prepared.reply:
        code, names = ((RequestCode.SEND_REPLY_MESSAGE_V2, _V2_NAMES) if v2
                       else (RequestCode.SEND_REPLY_MESSAGE, _V1_NAMES))
    elif v2:
        code, names = RequestCode.SEND_MESSAGE_V2, _V2_NAMES
    else:
        code, names = RequestCode.SEND_MESSAGE, _V1_NAMES
    return RemotingCommand(code=int(code), ext_fields=dict(zip(names, values)), body=prepared.body,
                           flag=FLAG_ONEWAY if oneway else 0)


# Field order of ``values`` above: SendMessageRequestHeader's, and its letters (maxReconsumeTimes, l, unset).
_V1_NAMES = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
             "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "batch", "brokerName")
_V2_NAMES = tuple(H.to_v2_names(dict.fromkeys(_V1_NAMES)))
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_LANGUAGE = RemotingCommand.__dataclass_fields__["language"].default
_request = _command  # RemotingCommand with every field given, without the frozen __init__
_time = time.time


def parse_send_response(response: RemotingCommand, prepared: PreparedSend, mq: MessageQueue) -> SendResult:
    """MQClientAPIImpl.processSendResponse: the four storing codes give a result, anything else raises."""
    status = _STATUS_BY_CODE.get(response.code)  # type: ignore[call-overload]
    if status is None:
        raise error_for_response(response)
    header = _read_send_response(response.ext_fields)
    queue_id = header.queue_id
    # The queue sent to, as a rule (MessageQueue is immutable): one object fewer per send.
    queue = mq if queue_id == mq.queue_id else MessageQueue(topic=mq.topic, broker_name=mq.broker_name,
                                                             queue_id=queue_id)
    result = _new_object(SendResult)
    _set_status(result, status)
    _set_msg_id(result, prepared.msg_id)
    _set_offset_msg_id(result, header.msg_id)
    _set_queue(result, queue)
    _set_queue_offset(result, header.queue_offset)
    _set_transaction_id(result, header.transaction_id)
    return result


# SendMessageResponseHeader.from_command's compiled reader itself (keyed by the wire names: from_ext's reader),
# without the two calls in front of it: one runs per send.
_read_send_response = fields.keyed_reader(H.SendMessageResponseHeader, {})

# SendResult(...) without the frozen __init__'s object.__setattr__ per field: one is made per send.
_set_status, _set_msg_id, _set_offset_msg_id, _set_queue, _set_queue_offset, _set_transaction_id = (
    SendResult.__dict__[name].__set__ for name in ("status", "msg_id", "offset_msg_id", "queue", "queue_offset",
                                                   "transaction_id"))
assert len(dataclasses.fields(SendResult)) == 6, "parse_send_response sets every SendResult field"
