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
