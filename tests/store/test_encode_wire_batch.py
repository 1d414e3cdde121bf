"""encode_batch_body (a SEND_BATCH_MESSAGE body straight to records, in C) equals the two-step path.

The reference: decode_batch_messages(body, inherited) -> StoreMessages -> encode_batch. For any
body the C path either declines (None: the broker then takes the reference path, which encodes
or refuses) or gives byte-identical records and the same dispatch columns.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import MessageIllegalError
from sluice.protocol import properties as P
from sluice.protocol.batch import decode_batch_messages, encode_batch
from sluice.speedups import C
from sluice.store.encode import encode_batch as encode_messages
from sluice.store.encode import encode_batch_body
from sluice.store.types import StoreMessage

pytestmark = pytest.mark.skipif(C is None, reason="the C extension is not built")

BORN, STORE = ("10.1.2.3", 51000), ("127.0.0.1", 10911)
MAX_BODY = 4096

names = st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "region", "DELAY", "TIMER_DELAY_MS",
                                   "__RMQ.TRANSIENT.x", "WAIT"]),
                  st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
                          max_size=6))
values = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=["Cs"]), max_size=8)


def raw_props(pairs: list[tuple[str, str]], tail: str) -> str:
    """Properties as a client may write them: usually canonical, sometimes not (the tail)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in pairs) + tail


clean_names = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "region", "amount", "ünï", "名"])
clean_values = st.text(st.characters(min_codepoint=3, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
                       min_size=1, max_size=8)


@st.composite
def batches(draw):
    """Mostly batches a client really sends (which C must take and get right), sometimes odd ones."""
    odd = draw(st.integers(0, 3)) == 0
    msgs = []
    for _ in range(draw(st.integers(1, 6))):
        if odd:
            body = draw(st.binary(min_size=0, max_size=64) | st.just(b"x" * (MAX_BODY + 1)))
            pairs = draw(st.lists(st.tuples(names, values), max_size=5))
            tail = draw(st.sampled_from(["", "", "", "x", "\x02", "a\x01", "\x01b\x02", "k\x01v"]))
        else:
            body = draw(st.binary(min_size=1, max_size=64))
            pairs = list(draw(st.dictionaries(clean_names, clean_values, max_size=5)).items())
            tail = ""
        msgs.append((body, raw_props(pairs, tail), draw(st.integers(-2**31, 2**31 - 1))))
    return msgs


def wire(msgs) -> bytes:
    """The batch body with raw property strings (encode_batch would canonicalise them)."""
    import struct
    out = b""
    for body, props, flag in msgs:
        p = props.encode("utf-8", "surrogatepass")
        out += struct.pack(">iiiii", 22 + len(body) + len(p), 0, 0, flag, len(body)) + body + \
            struct.pack(">h", len(p)) + p
    return out


def reference(body: bytes, inherited: dict[str, str], **kw):
    try:
        bodies, dicts, flags = decode_batch_messages(body, inherited)
        if not bodies or not all(bodies):
            raise MessageIllegalError("empty")
        msgs = [StoreMessage(kw["topic"], b, kw["queue_id"], d, f, kw["sysflag"], kw["born_timestamp"],
                             kw["born_host"], kw["reconsume_times"]) for b, d, f in zip(bodies, dicts, flags)]
        from sluice.broker.schedule import _DELAY_NAMES
        if any(not _DELAY_NAMES.isdisjoint(d) for d in dicts):
            return "delayed"
        return encode_messages(msgs, store_host=kw["store_host"], max_body=kw["max_body"])
    except MessageIllegalError as e:
        return f"refused: {e}"


KW = dict(topic="Orders", queue_id=3, sysflag=0, born_timestamp=1_700_000_000_123, born_host=BORN,
          store_host=STORE, reconsume_times=0, max_body=MAX_BODY)


@settings(max_examples=300, deadline=None)
@given(msgs=batches(), inherited=st.sampled_from([{}, {"WAIT": "true"}, {"WAIT": "true", "x": "1"}, {"KEYS": "k"}]),
       sysflag=st.sampled_from([0, 0x1, 0x30, 0x4]))
def test_c_body_encoder_equals_decode_then_encode(msgs, inherited, sysflag) -> None:
    body = wire(msgs)
    kw = {**KW, "sysflag": sysflag}
    fast = encode_batch_body(body, inherited=inherited, **kw)
    ref = reference(body, inherited, **kw)
    tried.append(1)
    if fast is None:
        return  # declined: the broker takes the reference path
    assert fast == ref
    taken.append(1)


taken: list[int] = []
tried: list[int] = []


def test_many_generated_batches_were_taken_by_c() -> None:
    """The comparison above means something only if C took many of the batches (a quarter of them
    are odd on purpose, and some header properties and sysflags make it decline by design)."""
    assert len(tried) >= 100 and len(taken) >= 0.25 * len(tried), (len(taken), len(tried))


def test_the_usual_batch_is_taken_by_c() -> None:
    body = encode_batch([(b"x" * 100, {"TAGS": "TagA", "KEYS": f"order-{i}", "UNIQ_KEY": f"U{i:031d}"}, 0)
                         for i in range(32)])
    fast = encode_batch_body(body, inherited={"WAIT": "true"}, **KW)
    assert fast is not None and fast == reference(body, {"WAIT": "true"}, **KW)
    assert fast.tags == ["TagA"] * 32 and fast.keys[5] == "order-5"
    assert fast.props[0] == "WAIT\x01true\x02TAGS\x01TagA\x02KEYS\x01order-0\x02UNIQ_KEY\x01U" + "0" * 31 + "\x02"


@pytest.mark.parametrize("props", [
    {"DELAY": "3"},  # delayed: the schedule service decides (and refuses it in a batch)
    {"a": "1"},
])
def test_declines_what_it_must_not_decide(props) -> None:
    body = encode_batch([(b"x", props, 0)])
    fast = encode_batch_body(body, inherited={}, **KW)
    if "DELAY" in props:
        assert fast is None
    else:
        assert fast == reference(body, {}, **KW)
    assert encode_batch_body(body, inherited={}, **{**KW, "born_host": ("::1", 5)}) is None  # IPv6
    assert encode_batch_body(body[:-1], inherited={}, **KW) is None  # malformed
    assert encode_batch_body(body, inherited={"a\x01": "v"}, **KW) is None  # a separator in a header name
    assert P.decode_properties("a\x011\x02") == {"a": "1"}
