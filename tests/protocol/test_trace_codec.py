"""The trace codec against RocketMQ's TraceDataEncoder: fixed bodies as Java writes them, and round trips."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.protocol.trace import (CONTENT_SEP, FIELD_SEP, ConsumeReturnType, MsgType, TraceBean, TraceContext,
                                   TraceFormatError, TraceType, decode_traces, encode_context, encode_contexts)

MSG_ID = "7F00000100002A9F0000000000000001"
OFFSET_ID = "7F00000100002A9F00000000000004D2"

# What TraceDataEncoder.encoderFromContextBean (RocketMQ 4.9) appends for a Pub, a SubBefore and a SubAfter,
# written out field by field: \x01 between fields, \x02 after each line.
JAVA_BODY = (
    b"Pub\x011700000000123\x01DefaultRegion\x01PG_orders\x01Orders\x01" + MSG_ID.encode()
    + b"\x01TagA\x01order-1 order-2\x01127.0.0.1:10911\x0111\x014\x010\x01" + OFFSET_ID.encode() + b"\x01true\x02"
    b"SubBefore\x011700000000200\x01DefaultRegion\x01CG_orders\x01REQ1\x01" + MSG_ID.encode()
    + b"\x010\x01order-1 order-2\x02"
    b"SubAfter\x01REQ1\x01" + MSG_ID.encode()
    + b"\x017\x01false\x01order-1 order-2\x014\x011700000000200\x01CG_orders\x02"
)


def test_decodes_a_body_as_rocketmq_writes_it() -> None:
    pub, before, after = decode_traces(JAVA_BODY)
    assert pub == TraceContext(TraceType.Pub, timestamp=1700000000123, region_id="DefaultRegion", group="PG_orders",
                               cost_time=4, success=True, beans=[TraceBean(
                                   topic="Orders", msg_id=MSG_ID, offset_msg_id=OFFSET_ID, tags="TagA",
                                   keys="order-1 order-2", store_host="127.0.0.1:10911", body_length=11,
                                   msg_type=MsgType.Normal_Msg)])
    assert before == TraceContext(TraceType.SubBefore, timestamp=1700000000200, region_id="DefaultRegion",
                                  group="CG_orders", request_id="REQ1",
                                  beans=[TraceBean(msg_id=MSG_ID, retry_times=0, keys="order-1 order-2")])
    assert after == TraceContext(TraceType.SubAfter, timestamp=1700000000200, group="CG_orders", request_id="REQ1",
                                 cost_time=7, success=False, context_code=ConsumeReturnType.FAILED,
                                 beans=[TraceBean(msg_id=MSG_ID, keys="order-1 order-2")])


def test_encodes_byte_for_byte_as_rocketmq() -> None:
    body, keys = encode_contexts(decode_traces(JAVA_BODY))
    assert body == JAVA_BODY
    assert keys == [MSG_ID, "order-1", "order-2"]


def test_a_batch_context_is_one_line_per_message_and_null_keys_are_no_keys() -> None:
    ctx = TraceContext(TraceType.SubBefore, timestamp=5, group="G", request_id="R",
                       beans=[TraceBean(msg_id="A", keys="null"), TraceBean(msg_id="B", keys="k")])
    data, keys = encode_context(ctx)
    assert data == "SubBefore\x015\x01\x01G\x01R\x01A\x010\x01null\x02SubBefore\x015\x01\x01G\x01R\x01B\x010\x01k\x02"
    assert keys == ["A", "B", "k"]
    assert [c.beans[0].msg_id for c in decode_traces(data)] == ["A", "B"]


def test_older_writers_lines() -> None:
    # A Pub without offsetMsgId (13 fields), a newer Pub with clientHost (15), SubAfters of 6, 7 and 8 fields.
    pub13 = "Pub\x011\x01r\x01g\x01T\x01M\x01t\x01k\x01h:1\x012\x013\x013\x01true\x02"
    pub15 = "Pub\x011\x01r\x01g\x01T\x01M\x01t\x01k\x01h:1\x012\x013\x010\x01O\x01false\x0110.0.0.1\x02"
    sub6 = "SubAfter\x01R\x01M\x015\x01true\x01k\x02"
    sub7 = "SubAfter\x01R\x01M\x015\x01TRUE\x01k\x012\x02"
    sub8 = "SubAfter\x01R\x01M\x015\x01true\x01k\x012\x0199\x02"
    a, b, c, d, e = decode_traces(pub13 + pub15 + sub6 + sub7 + sub8)
    assert a.success and a.beans[0].offset_msg_id == "" and a.beans[0].msg_type == MsgType.Delay_Msg
    assert not b.success and b.beans[0].offset_msg_id == "O" and b.beans[0].client_host == "10.0.0.1"
    assert (c.context_code, c.timestamp, c.group) == (0, 0, "")
    assert d.success and d.context_code == 2 and d.timestamp == 0
    assert (e.context_code, e.timestamp, e.group) == (2, 99, "")


def test_unknown_types_and_empty_lines_are_skipped() -> None:
    assert decode_traces(b"") == []
    assert decode_traces("Recall\x01x\x02\x02SubAfter\x01R\x01M\x015\x01true\x01k\x02")[0].beans[0].msg_id == "M"


@pytest.mark.parametrize("body, message", [
    ("Pub\x011\x01r\x01g\x02", "has 4 fields, at least 13"),
    ("SubBefore\x01x\x01r\x01g\x01R\x01M\x010\x01k\x02", r"field 1 \(timestamp\) 'x' is not an integer"),
    ("SubAfter\x01R\x01M\x01 5\x01true\x01k\x02", r"field 3 \(costTime\)"),
    (b"Pub\xff", "not UTF-8"),
])
def test_malformed_lines_are_refused_precisely(body: str | bytes, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        decode_traces(body)


def test_separators_inside_fields_and_beanless_contexts_are_refused() -> None:
    with pytest.raises(TraceFormatError, match="keys"):
        encode_context(TraceContext(TraceType.SubBefore, beans=[TraceBean(msg_id="M", keys="a\x01b")]))
    with pytest.raises(TraceFormatError, match="at least one bean"):
        encode_context(TraceContext(TraceType.Pub))


# ------------------------------------------------------------------------------ round trips

text = st.text(st.characters(blacklist_characters=CONTENT_SEP + FIELD_SEP, blacklist_categories=("Cs",)),
               max_size=12)
ints = st.integers(-2**31, 2**31 - 1)
longs = st.integers(-2**63, 2**63 - 1)


@st.composite
def contexts(draw: st.DrawFn) -> TraceContext:
    """A one-bean context whose every field is one its type's line carries (the others stay default)."""
    t = draw(st.sampled_from(list(TraceType)))
    if t is TraceType.Pub:
        bean = TraceBean(topic=draw(text), msg_id=draw(text), tags=draw(text), keys=draw(text),
                         store_host=draw(text), body_length=draw(ints), msg_type=draw(st.sampled_from(list(MsgType))),
                         offset_msg_id=draw(text))
        return TraceContext(t, timestamp=draw(longs), region_id=draw(text), group=draw(text),
                            cost_time=draw(ints), success=draw(st.booleans()), beans=[bean])
    if t is TraceType.SubBefore:
        bean = TraceBean(msg_id=draw(text), retry_times=draw(ints), keys=draw(text))
        return TraceContext(t, timestamp=draw(longs), region_id=draw(text), group=draw(text),
                            request_id=draw(text), beans=[bean])
    if t is TraceType.SubAfter:
        bean = TraceBean(msg_id=draw(text), keys=draw(text))
        return TraceContext(t, request_id=draw(text), cost_time=draw(ints), success=draw(st.booleans()),
                            context_code=draw(ints), timestamp=draw(longs), group=draw(text), beans=[bean])
    bean = TraceBean(topic=draw(text), msg_id=draw(text), tags=draw(text), keys=draw(text), store_host=draw(text),
                     msg_type=draw(st.sampled_from(list(MsgType))), transaction_id=draw(text),
                     transaction_state=draw(st.sampled_from(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"])),
                     from_transaction_check=draw(st.booleans()))
    return TraceContext(t, timestamp=draw(longs), region_id=draw(text), group=draw(text), beans=[bean])


@settings(max_examples=300, deadline=None)
@given(st.lists(contexts(), max_size=6))
def test_decode_inverts_encode(ctxs: list[TraceContext]) -> None:
    body, keys = encode_contexts(ctxs)
    assert decode_traces(body) == ctxs
    assert encode_contexts(decode_traces(body))[0] == body
    assert all(c.beans[0].msg_id in keys for c in ctxs)


# ------------------------------------------------------------------------------ RocketMQ's exact layout

def _java_encoder(ctx: TraceContext) -> tuple[str, set[str]]:
    """TraceDataEncoder.encoderFromContextBean (RocketMQ 4.9.8) transcribed append by append, independently of
    the codec: Pub and EndTransaction write the first bean only, SubBefore and SubAfter one line per bean; Java
    appends booleans as true/false, MessageType as its ordinal, LocalTransactionState as its name. The keys are
    TraceTransferBean.transKey: each bean's msgId and its keys split at spaces (Java's split drops trailing
    empty strings; "null" is how Sluice writes Java's null keys)."""
    C, F = "\x01", "\x02"
    j = lambda v: ("true" if v else "false") if isinstance(v, bool) else str(v)  # noqa: E731
    sb = []
    t = ctx.trace_type.value
    if ctx.trace_type is TraceType.Pub:
        b = ctx.beans[0]
        sb += [t, C, j(ctx.timestamp), C, ctx.region_id, C, ctx.group, C, b.topic, C, b.msg_id, C, b.tags, C,
               b.keys, C, b.store_host, C, j(b.body_length), C, j(ctx.cost_time), C, j(int(b.msg_type)), C,
               b.offset_msg_id, C, j(ctx.success), F]
    elif ctx.trace_type is TraceType.SubBefore:
        for b in ctx.beans:
            sb += [t, C, j(ctx.timestamp), C, ctx.region_id, C, ctx.group, C, ctx.request_id, C, b.msg_id, C,
                   j(b.retry_times), C, b.keys, F]
    elif ctx.trace_type is TraceType.SubAfter:
        for b in ctx.beans:
            sb += [t, C, ctx.request_id, C, b.msg_id, C, j(ctx.cost_time), C, j(ctx.success), C, b.keys, C,
                   j(ctx.context_code), C, j(ctx.timestamp), C, ctx.group, F]
    else:
        b = ctx.beans[0]
        sb += [t, C, j(ctx.timestamp), C, ctx.region_id, C, ctx.group, C, b.topic, C, b.msg_id, C, b.tags, C,
               b.keys, C, b.store_host, C, j(int(b.msg_type)), C, b.transaction_id, C, b.transaction_state, C,
               j(b.from_transaction_check), F]
    keys: set[str] = set()
    for b in ctx.beans:
        keys.add(b.msg_id)
        if b.keys != "null" and b.keys:
            parts = b.keys.split(" ")
            while parts and parts[-1] == "":
                parts.pop()
            keys.update(parts)
    return "".join(sb), keys


@st.composite
def java_contexts(draw: st.DrawFn) -> TraceContext:
    """Any context a Java client makes: several beans (a consumed batch; Pub / EndTransaction write the first)."""
    t = draw(st.sampled_from(list(TraceType)))
    beans = [TraceBean(topic=draw(text), msg_id=draw(text), offset_msg_id=draw(text), tags=draw(text),
                       keys=draw(st.one_of(text, st.just("null"), st.just("a  b "))), store_host=draw(text),
                       retry_times=draw(ints), body_length=draw(ints), msg_type=draw(st.sampled_from(list(MsgType))),
                       transaction_id=draw(text),
                       transaction_state=draw(st.sampled_from(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"])),
                       from_transaction_check=draw(st.booleans()))
             for _ in range(draw(st.integers(1, 4)))]
    return TraceContext(t, timestamp=draw(longs), region_id=draw(text), group=draw(text), cost_time=draw(ints),
                        success=draw(st.booleans()), request_id=draw(text), context_code=draw(ints), beans=beans)


@settings(max_examples=400, deadline=None)
@given(java_contexts())
def test_encodes_every_context_as_rocketmqs_encoder(ctx: TraceContext) -> None:
    data, keys = encode_context(ctx)
    java_data, java_keys = _java_encoder(ctx)
    assert data == java_data
    assert set(keys) - {""} == java_keys - {""}
    # What Java's decoder reads back of it: every line, one bean each, the fields its layout carries.
    decoded = decode_traces(data)
    lines = 1 if ctx.trace_type in (TraceType.Pub, TraceType.EndTransaction) else len(ctx.beans)
    assert [c.beans[0].msg_id for c in decoded] == [b.msg_id for b in ctx.beans[:lines]]
    assert encode_contexts(decoded)[0] == data.encode()


# What a Java TransactionMQProducer's EndTransactionTraceHookImpl records: a commit after the local transaction
# and a rollback answering the broker's check (msgType Trans_msg_Commit either way).
JAVA_END_TX = (
    b"EndTransaction\x011700000000500\x01DefaultRegion\x01PG_tx\x01Orders\x01" + MSG_ID.encode()
    + b"\x01TagA\x01null\x01127.0.0.1:10911\x012\x01" + MSG_ID.encode() + b"\x01COMMIT_MESSAGE\x01false\x02"
    b"EndTransaction\x011700000060500\x01DefaultRegion\x01PG_tx\x01Orders\x01" + MSG_ID.encode()
    + b"\x01TagA\x01null\x01127.0.0.1:10911\x012\x01" + MSG_ID.encode() + b"\x01ROLLBACK_MESSAGE\x01true\x02"
)


def test_decodes_end_transaction_records_as_rocketmq_writes_them() -> None:
    commit, rollback = decode_traces(JAVA_END_TX)
    assert commit == TraceContext(TraceType.EndTransaction, timestamp=1700000000500, region_id="DefaultRegion",
                                  group="PG_tx", beans=[TraceBean(
                                      topic="Orders", msg_id=MSG_ID, tags="TagA", keys="null",
                                      store_host="127.0.0.1:10911", msg_type=MsgType.Trans_msg_Commit,
                                      transaction_id=MSG_ID, transaction_state="COMMIT_MESSAGE")])
    assert rollback.beans[0].transaction_state == "ROLLBACK_MESSAGE" and rollback.beans[0].from_transaction_check
    body, keys = encode_contexts([commit, rollback])
    assert body == JAVA_END_TX and keys == [MSG_ID]


@pytest.mark.parametrize("body, message", [
    ("Pub\x011\x01r\x01g\x01T\x01M\x01t\x01k\x01h:1\x012\x013\x015\x01O\x01true\x02",
     r"field 11 \(msgType\) 5 is not a MessageType ordinal \(0..4\)"),
    ("EndTransaction\x011\x01r\x01g\x01T\x01M\x01t\x01k\x01h:1\x01-1\x01X\x01COMMIT_MESSAGE\x01false\x02",
     r"field 9 \(msgType\) -1"),
    ("EndTransaction\x011\x01r\x01g\x01T\x01M\x01t\x01k\x01h:1\x012\x01X\x01COMMIT\x01false\x02",
     r"field 11 \(transactionState\) 'COMMIT' is not one of COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW"),
])
def test_values_javas_decoder_refuses_are_refused_precisely(body: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        decode_traces(body)
