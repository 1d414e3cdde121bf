"""sluice._speedups against its pure-Python references: the protocol decoders, key hashes and message ids.

Each C function must give exactly what its reference gives (bytes, values, dict key order), or, for
input the C declines, the answer that sends the caller to the Python path (None). The store-side
functions (encode_batch, index_put, patch_records) are in test_speedups_store.py.

Without the extension the comparisons are skipped, unless SLUICE_REQUIRE_EXTENSIONS=1 (CI builds it):
then they run and fail, so a broken build cannot pass as "skipped".
"""
from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sluice.speedups
from sluice.errors import MessageIllegalError
from sluice.protocol import batch as B
from sluice.protocol import properties as P
from sluice.store import keyhash
from sluice.store.index import index_keys

C = sluice.speedups.C
REQUIRED = os.environ.get("SLUICE_REQUIRE_EXTENSIONS", "") not in ("", "0")
pytestmark = pytest.mark.skipif(C is None and not REQUIRED, reason="sluice._speedups is not built")


def test_extension_built_when_required():
    # CI sets SLUICE_REQUIRE_EXTENSIONS=1: a missing or unimportable extension must fail, not skip.
    assert not (REQUIRED and C is None), "SLUICE_REQUIRE_EXTENSIONS=1 but sluice._speedups did not import"


# The references: properties.py's pure twin (decode_properties is the C one when built) and batch.py's
# column splitter (pure: decode_batch_messages calls C first and falls back to it).
decode_props_py = P._decode_properties_py
assert decode_props_py is not getattr(C, "decode_properties", None)


# Characters that matter: the separators, the key separator, ASCII, Latin-1 (1-byte str kind), BMP (2-byte
# kind), astral (4-byte kind, a surrogate pair in Java's hash) and lone surrogates.
SPECIAL = ["\x01", "\x02", " ", "\x00", "a", "Z", "é", "ÿ", "€", "\uffff", "😀", "\U0010ffff", "\ud800", "\udfff"]
chars = st.sampled_from(SPECIAL) | st.characters(codec=None, exclude_categories=())
text = st.text(chars, max_size=40)
utf8_chars = st.sampled_from([c for c in SPECIAL if not 0xD800 <= ord(c) <= 0xDFFF]) | st.characters(codec="utf-8")


def items(d):
    return list(d.items())  # dict == ignores order; the stored order is part of the contract


# ------------------------------------------------------------------------------------- decode_properties

# Encoded properties and near misses: parts shorter than 3 chars, empty names or values, no \x01, repeated
# names (last value, first position), a trailing part with no \x02, extra \x01 inside a value.
part = st.one_of(
    st.tuples(st.sampled_from(["TAGS", "KEYS", "a", "é", "😀", ""]), st.sampled_from(["", "v", "x\x01y", "ÿ€😀"])).map(
        lambda t: f"{t[0]}\x01{t[1]}"),
    st.text(chars, max_size=3),
    text,
)
props_text = st.one_of(text, st.lists(part, max_size=8).map("\x02".join), st.lists(part, max_size=8).map(
    lambda ps: "".join(p + "\x02" for p in ps)))


@settings(max_examples=400)
@given(props_text)
@example("")
@example("a\x01b")  # exactly 3 chars, no trailing separator
@example("ab\x02\x01\x02a\x01\x02\x01bb\x02")  # short parts, empty value, empty name: all dropped
@example("k\x011\x02j\x012\x02k\x013\x02")  # k keeps its first position and takes its last value
@example("\U0010ffff\x01\ud800\x02")
def test_decode_properties_equals_python(s):
    assert items(C.decode_properties(s)) == items(decode_props_py(s))


@settings(max_examples=100)
@given(st.dictionaries(st.text(utf8_chars.filter(lambda c: c not in "\x01\x02"), min_size=1, max_size=8),
                       st.text(utf8_chars.filter(lambda c: c not in "\x01\x02"), min_size=1, max_size=8),
                       max_size=6))
def test_decode_properties_inverts_encode(d):
    # Independent of the reference: valid properties round-trip through the (pure) encoder, order kept.
    d = {k: v for k, v in d.items() if not k.startswith(P.TRANSIENT_PREFIX)}
    assert items(C.decode_properties(P.encode_properties(d))) == items(d)


def test_decode_properties_reuses_strings_without_mixing_them():
    # The C decoder hands out property strings it made before (common.c's cache): every result still equals
    # the pure decoder's, names interned, with more distinct strings than the cache has slots and names that
    # are other messages' values (and the other way round).
    texts = [P.encode_properties({f"k{i % 700}": f"v{i}", "TAGS": f"k{i % 700}", f"v{i}": "TAGS", "é": f"é{i % 9}"})
             for i in range(3000)]
    for s in texts * 2:
        d = C.decode_properties(s)
        assert items(d) == items(decode_props_py(s))
        assert all(sys.intern(k) is k for k in d)


def test_decode_properties_refuses_non_str():
    with pytest.raises(TypeError):
        C.decode_properties(b"a\x01b\x02")


# ------------------------------------------------------------------------------------------ decode_batch

def decode_batch_py(data, inherited):
    """send.py's merge: the message's own properties override the inherited ones (dict order of the merge)."""
    bodies, raw, flags = B.decode_batch_columns(data)
    dicts = list(map(decode_props_py, raw))
    if inherited:
        dicts = [{**inherited, **d} for d in dicts]
    return bodies, dicts, flags


def same_batch(c, py):
    assert c is not None, "C refused a batch Python decodes"
    assert c[0] == py[0] and c[2] == py[2]
    assert [items(d) for d in c[1]] == [items(d) for d in py[1]]


entry = st.tuples(st.binary(max_size=64),
                  st.dictionaries(st.text(utf8_chars, max_size=5), st.text(utf8_chars, max_size=5), max_size=4),
                  st.integers(-2**31, 2**31 - 1))
inherited_s = st.none() | st.dictionaries(st.sampled_from(["TAGS", "KEYS", "a", "b", "é"]),
                                          st.text(utf8_chars, min_size=1, max_size=4), max_size=3)


def layout(data):
    """(start, body length) of each message of a valid batch: where mutations aim."""
    pos, out = 0, []
    while pos < len(data):
        total, _, _, _, blen = struct.unpack_from(">iiiii", data, pos)
        out.append((pos, blen))
        pos += total
    return out


# Ways to break a valid batch: a field of some message overwritten (total, flag, body length, properties
# length), bytes that are not UTF-8 in its properties, a truncation, stray bytes, or a random byte.
INTERESTING = [-2**31, -1, 0, 1, 2, 21, 22, 23, 0x7FFF, 0x8000, 0xFFFF, 2**31 - 1]
mutation = st.one_of(
    st.tuples(st.just("field"), st.integers(0, 10), st.sampled_from([0, 12, 16, "plen"]),
              st.sampled_from(INTERESTING) | st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("utf8"), st.integers(0, 10), st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\x80"])),
    st.tuples(st.just("cut"), st.integers(0, 4096)),
    st.tuples(st.just("stray"), st.binary(min_size=1, max_size=30)),
    st.tuples(st.just("byte"), st.integers(0, 4096), st.integers(0, 255)),
)


def mutate(b, where, m):
    """Apply mutation ``m`` to ``b`` in place; ``where`` is the layout of the batch before any mutation."""
    kind = m[0]
    if kind in ("field", "utf8"):
        at, blen = where[m[1] % len(where)]
        plen_at = at + 20 + blen
        if kind == "field" and m[2] == "plen":
            if plen_at + 2 <= len(b):
                struct.pack_into(">h", b, plen_at, max(-2**15, min(2**15 - 1, m[3])))
        elif kind == "field":
            if at + m[2] + 4 <= len(b):
                struct.pack_into(">i", b, at + m[2], m[3])
        elif plen_at + 2 <= len(b):  # over the properties' first bytes, lengths unchanged
            bad = m[2][:max(0, struct.unpack_from(">h", b, plen_at)[0])]
            b[plen_at + 2:plen_at + 2 + len(bad)] = bad
    elif kind == "cut":
        del b[m[1] % (len(b) + 1):]
    elif kind == "stray":
        b += m[1]
    elif b:
        b[m[1] % len(b)] = m[2]


@settings(max_examples=300)
@given(st.lists(entry, min_size=1, max_size=4), st.lists(mutation, min_size=1, max_size=2), inherited_s)
@example([(b"x", {}, 0)], [("cut", 21)], None)
@example([(b"x", {"a": "b"}, 0)], [("utf8", 0, b"\xff")], None)
@example([(b"", {}, 0)], [("field", 0, 16, -1)], None)
@example([(b"", {}, 0)], [("field", 0, "plen", -1)], None)
def test_decode_batch_malformed_none_exactly_when_python_raises(entries, mutations, inherited):
    valid = B.encode_batch(entries)
    buf, where = bytearray(valid), layout(valid)
    for m in mutations:
        mutate(buf, where, m)
    data = bytes(buf)
    try:
        py = decode_batch_py(data, inherited)
    except MessageIllegalError:
        assert C.decode_batch(data, inherited) is None
        with pytest.raises(MessageIllegalError):  # and the broker's entry point still says why
            B.decode_batch_messages(data, inherited)
    else:
        same_batch(C.decode_batch(data, inherited), py)
        same_batch(B.decode_batch_messages(data, inherited), py)


@settings(max_examples=200)
@given(st.binary(max_size=80))
def test_decode_batch_random_bytes(data):
    try:
        py = decode_batch_py(data, None)
    except MessageIllegalError:
        assert C.decode_batch(data, None) is None
    else:
        same_batch(C.decode_batch(data, None), py)


def test_decode_batch_inherited_order_and_override():
    data = B.encode_batch([(b"b", {"z": "own", "KEYS": "k1"}, 7)])
    bodies, dicts, flags = C.decode_batch(data, {"KEYS": "hdr", "a": "1"})
    assert (bodies, flags) == ([b"b"], [7])
    assert items(dicts[0]) == [("KEYS", "k1"), ("a", "1"), ("z", "own")]
    with pytest.raises(TypeError):
        C.decode_batch(data, [("a", "1")])


# ------------------------------------------------------------------------------------- key_hash & index

def java_hash_oracle(topic, key):
    """IndexFile.indexKeyHashMethod from its definition: Java hashCode over UTF-16 code units, signed,
    abs(), Integer.MIN_VALUE -> 0. Independent of keyhash.py, should that move to C too."""
    h = 0
    units = (topic + "#" + key).encode("utf-16-be", "surrogatepass")
    for (u,) in struct.iter_unpack(">H", units):
        h = (h * 31 + u) & 0xFFFFFFFF
    h = h - (1 << 32) if h & 0x80000000 else h
    return 0 if h == -(1 << 31) else abs(h)


def min_value_key(topic):
    """A 7-character key whose Java hash of ``topic#key`` is exactly Integer.MIN_VALUE (0x80000000)."""
    p = keyhash.prefix_hash(topic)
    ones = sum(31**k for k in range(7))
    d = (0x80000000 - p * 31**7 - 65 * ones) % (1 << 32)  # < 31**7: fits seven base-31 digits
    digits = [(d // 31**k) % 31 for k in range(6, -1, -1)]
    return "".join(chr(65 + x) for x in digits)


topics = st.sampled_from(["T", "TopicA", "%RETRY%g", "a" * 127]) | st.text("ab_%|-09", min_size=1, max_size=10)


@settings(max_examples=300)
@given(topics, text)
@example("T", min_value_key("T"))
@example("TopicA", min_value_key("TopicA"))
@example("T", "\ud83d\ude00")  # a surrogate pair spelled as two code points: the same units as U+1F600
def test_key_hash_equals_python(topic, key):
    expected = keyhash.key_hash(topic, key)
    assert expected == java_hash_oracle(topic, key)
    assert C.key_hash(keyhash.prefix_hash(topic), key) == expected


def test_key_hash_min_value_maps_to_zero():
    key = min_value_key("T")
    raw = 0
    for (u,) in struct.iter_unpack(">H", ("T#" + key).encode("utf-16-be")):
        raw = (raw * 31 + u) & 0xFFFFFFFF
    assert raw == 0x80000000  # the construction really hits MIN_VALUE
    assert keyhash.key_hash("T", key) == 0 and C.key_hash(keyhash.prefix_hash("T"), key) == 0
    assert C.key_hash(keyhash.prefix_hash("T"), key[:-1] + chr(ord(key[-1]) + 1)) == 2**31 - 1  # MIN + 1


keys_text = st.one_of(st.none(), text, st.lists(st.text(chars.filter(lambda c: c != " "), max_size=6),
                                                 max_size=5).map(" ".join))
record = st.tuples(st.none() | text, keys_text, st.integers(-2**63, 2**63 - 1),
                   st.sampled_from([0, 0x4, 0x8, 0xC, 0x1C, -1, -4, 2**31 - 1]) | st.integers(-2**31, 2**31 - 1))


@settings(max_examples=150)
@given(topics, st.lists(record, max_size=6))
@example("T", [("u", " a  b ", 5, 0), ("", "", 6, 0), ("r", "k", 7, 0xC), (None, min_value_key("T"), 8, 8)])
def test_index_entries_equals_python(topic, recs):
    uniq, keys, phys, sysflags = (list(c) for c in zip(*recs)) if recs else ([], [], [], [])
    exp_h, exp_p = [], []
    for u, k, p, f in recs:
        if f & 0xC == 0xC:  # a rolled-back transaction is never indexed
            continue
        for name in index_keys(u, P.split_keys(k)):
            exp_h.append(keyhash.key_hash(topic, name))
            exp_p.append(p)
    h, p = C.index_entries(keyhash.prefix_hash(topic), uniq, keys, phys, sysflags)
    assert np.frombuffer(h, dtype=np.int64).tolist() == exp_h
    assert np.frombuffer(p, dtype=np.int64).tolist() == exp_p


def test_index_entries_refuses_bad_columns():
    with pytest.raises(ValueError):
        C.index_entries(0, ["u"], [None], [1, 2], [0])
    with pytest.raises(TypeError):
        C.index_entries(0, [b"u"], [None], [1], [0])
    with pytest.raises(TypeError):
        C.index_entries(0, [None], [5], [1], [0])


# ---------------------------------------------------------------------------------------- offset_msg_ids

@settings(max_examples=200)
@given(st.text("0123456789ABCDEF", max_size=64),
       st.lists(st.sampled_from([0, 1, 2**32, 2**63 - 1]) | st.integers(0, 2**63 - 1), max_size=8))
def test_offset_msg_ids_equal_python(prefix, offsets):
    assert C.offset_msg_ids(prefix, offsets) == [prefix + "%016X" % o for o in offsets]


@pytest.mark.parametrize("prefix, offsets, exc", [
    ("AB", [-1], ValueError),  # Python would give "AB-000000000000001": C refuses rather than differ
    ("AB", [2**63], OverflowError),  # 17 hex digits in Python: out of C's int64, refused
    ("é", [1], ValueError),
    ("A" * 65, [1], ValueError),
    ("AB", [1.0], TypeError),
])
def test_offset_msg_ids_refuses_outside_its_domain(prefix, offsets, exc):
    # Commit-log offsets are 0..2**63-1 and the prefix is a host's hex: anything else raises, never differs.
    with pytest.raises(exc):
        C.offset_msg_ids(prefix, offsets)


# ---- what the extension was compiled with: sluice.format's layout, MessageExt's slots ------------------------

def test_compiled_format_equals_sluice_format():
    from sluice.format import C_FORMAT

    assert C.FORMAT == C_FORMAT


def test_a_stale_build_is_refused_at_import_not_dropped():
    """An extension compiled with another layout makes ``import sluice.speedups`` fail (it is not set to None)."""
    import subprocess
    import sys

    code = ("import sys, types\n"
            "import sluice.format as fmt\n"
            "fake = types.ModuleType('sluice._speedups')\n"
            "fake.FORMAT = dict(fmt.C_FORMAT, MIN_RECORD_SIZE=fmt.MIN_RECORD_SIZE + 1)\n"
            "sys.modules['sluice._speedups'] = fake\n"
            "try:\n"
            "    import sluice.speedups\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, e)\n"
            "else:\n"
            "    print('imported', sluice.speedups.C)\n")
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_NO_EXTENSIONS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.startswith("FormatMismatchError") and "MIN_RECORD_SIZE: C 92 vs Python 91" in out


def test_check_format_names_every_difference():
    from sluice.format import C_FORMAT
    from sluice.speedups import FormatMismatchError, check_format

    check_format(dict(C_FORMAT))
    bad = dict(C_FORMAT, POS_SYSFLAG=40, EXTRA=1)
    del bad["MAGIC_V2"]
    with pytest.raises(FormatMismatchError, match="EXTRA.*MAGIC_V2.*POS_SYSFLAG"):
        check_format(bad)


def test_message_ext_has_every_slot_decode_messages_sets():
    from sluice.message import MessageExt
    from sluice.speedups import check_message_ext

    check_message_ext(MessageExt)
    assert set(C.MESSAGE_EXT_FIELDS) <= set(MessageExt.__slots__)


def test_a_renamed_message_ext_slot_fails_loudly():
    """Renaming a MessageExt field without the C side would only turn the C decoder off: it must raise."""
    import dataclasses

    from sluice.message import MessageExt
    from sluice.speedups import FormatMismatchError, check_message_ext

    names = [f.name if f.name != "store_size" else "stored_size" for f in dataclasses.fields(MessageExt)]
    renamed = dataclasses.make_dataclass("MessageExt", names, slots=True)
    with pytest.raises(FormatMismatchError, match="store_size"):
        check_message_ext(renamed)
    # and the C decoder indeed declines such a class (the silent slowdown the check prevents)
    from sluice.format import crc32
    from sluice.protocol.record import encode_record

    body = bytes(encode_record(topic="T", body=b"x", properties="a\x01b\x02"))
    assert C.decode_messages(body, True, crc32, MessageExt, bytes) is not None
    assert C.decode_messages(body, True, crc32, renamed, bytes) is None
