"""The C request signature (sluice._speedups.acl_signature, acl_sign, acl_verify) against its Python twin and
against hmac itself, with both kinds of pads the C takes: acl_pads' OpenSSL states and hashlib objects.

For every extFields map the C either gives exactly the Python twin's signature or declines (None) and the
Python path runs; for the maps every real client sends (ASCII keys, string values) it must not decline.
Without the extension the comparisons are skipped, unless SLUICE_REQUIRE_EXTENSIONS=1.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sluice.speedups
from sluice.acl import signature as S

C = sluice.speedups.C
REQUIRED = os.environ.get("SLUICE_REQUIRE_EXTENSIONS", "") not in ("", "0")
needs_c = pytest.mark.skipif(C is None and not REQUIRED, reason="sluice._speedups is not built")

ascii_keys = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
any_keys = st.one_of(ascii_keys, st.text(max_size=6), st.just("Signature"), st.just("\U00010000"))
str_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
any_values = st.one_of(str_values, st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.just("\ud800"))
bodies = st.one_of(st.none(), st.just(b""), st.binary(max_size=300), st.binary(min_size=2048, max_size=5000))


def reference(secret: str, ext: dict, body: bytes | None) -> bytes:
    """base64(HMAC-SHA1) by the standard library over signature.signed_content."""
    return base64.b64encode(hmac.new(secret.encode(), S.signed_content(ext, body), hashlib.sha1).digest())


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.dictionaries(any_keys, any_values, max_size=16), bodies, st.sampled_from(["k", "s" * 64, "é" * 40]))
@example({"Signature": "x", "a": None, "b": True}, None, "k")
@example({"a": "\ud800"}, b"x", "k")
def test_c_gives_the_python_signature_or_declines(ext: dict, body: bytes | None, secret: str) -> None:
    inner, outer, c_inner, c_outer = S.key_pads(secret)
    got = C.acl_signature(ext, inner, outer, body)
    native = C.acl_signature(ext, c_inner, c_outer, body)
    valid = C.acl_verify({**ext, "Signature": (got or b"").decode()}, c_inner, c_outer, body)
    try:
        want = S._py_signature(ext, inner, outer, body)
    except UnicodeEncodeError:  # a lone surrogate: the Python path raises, so the C must have declined
        assert got is None and native is None and valid is None
        return
    assert got is None or got == want
    assert native == got and valid == (None if got is None else True)
    assert want == reference(secret, ext, body)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(ascii_keys, st.one_of(str_values, st.none()), max_size=20), bodies,
       st.sampled_from([bytes, bytearray, memoryview]))
def test_c_signs_what_real_clients_send(ext: dict, body: bytes | None, kind: type) -> None:
    inner, outer, c_inner, c_outer = S.key_pads("secret")
    buf = None if body is None else kind(body)
    got = C.acl_signature(ext, inner, outer, buf)
    assert got is not None and got == reference("secret", ext, body)
    assert C.acl_signature(ext, c_inner, c_outer, buf) == got
    assert S.compute_signature("secret", ext, buf) == got.decode()
    signed = dict(ext)
    assert C.acl_sign(signed, "ak", c_inner, c_outer, buf) is True
    want = {k: v for k, v in ext.items() if k != "Signature"} | {"AccessKey": "ak"}
    assert signed == want | {"Signature": reference("secret", want, body).decode()}
    assert C.acl_verify(signed, c_inner, c_outer, buf) is True
    assert C.acl_verify(signed, inner, outer, buf) is True
    assert C.acl_verify(signed, *S.key_pads("other")[2:], buf) is False
    if body:
        assert C.acl_verify(signed, c_inner, c_outer, body[:-1]) is False


@needs_c
def test_c_declines_unusual_maps_and_refuses_bad_arguments() -> None:
    inner, outer, c_inner, c_outer = S.key_pads("k")
    assert C.acl_signature({f"k{i}": "v" for i in range(65)}, inner, outer, None) is None  # the twin's job
    assert C.acl_signature({1: "v"}, inner, outer, None) is None
    with pytest.raises(TypeError):
        C.acl_signature({}, inner, outer)
    with pytest.raises(TypeError):
        C.acl_signature({"a": "v"}, inner, outer, 5)  # a body that is no buffer: hashlib's own error
    assert S.key_pads("k")[0].digest() == inner.digest()  # the pads are copied, never changed
    before = (bytes(c_inner), bytes(c_outer)) if isinstance(c_inner, bytes) else None
    C.acl_signature({"a": "v"}, c_inner, c_outer, b"x" * 5000)
    assert before is None or (c_inner, c_outer) == before
    with pytest.raises(TypeError):
        C.acl_pads("not bytes")
    assert C.acl_sign([("a", "v")], "ak", c_inner, c_outer, None) is False  # not a dict: the twin's job
    assert C.acl_sign({"a": 1}, "ak", c_inner, c_outer, None) is False  # a value Java renders: the twin's


@needs_c
def test_verify_refuses_what_is_not_the_signature() -> None:
    """acl_verify answers False for a missing, non-str, non-ASCII or wrong-length Signature, as the Python
    twin's compare does, and leaves a str subclass to the twin."""
    _, _, c_inner, c_outer = S.key_pads("k")
    ext = {"a": "v", "AccessKey": "ak"}
    sig = C.acl_signature(ext, c_inner, c_outer, None).decode()

    class Str(str):
        pass
    assert C.acl_verify(ext, c_inner, c_outer, None) is False
    for sent, answer in ((sig, True), (5, False), (None, False), (sig[:-1], False), (sig + "=", False),
                          ("é" * 28, False), (sig[:-1] + "A" if sig[-1] != "A" else sig[:-1] + "B", False),
                          (Str(sig), None)):
        assert C.acl_verify({**ext, "Signature": sent}, c_inner, c_outer, None) is answer
        assert S._py_valid(S.key_pads("k"), {**ext, "Signature": sent}, None) is bool(answer or
                                                                                        sent == sig)


@needs_c
def test_native_pads_are_hmacs_keyed_states() -> None:
    """acl_pads' OpenSSL states sign as hmac does, for keys up to a block and longer (hashed first)."""
    if C.acl_pads(b"k") is None:
        pytest.skip("the extension was built without libcrypto (hashlib pads are tested above)")
    for secret in ("k", "k" * 64, "k" * 65, "é" * 40):
        _, _, c_inner, c_outer = S.key_pads(secret)
        assert isinstance(c_inner, bytes)
        ext = {"x": "1", "AccessKey": "ak"}  # signed in key order: AccessKey, then x
        want = base64.b64encode(hmac.new(secret.encode(), b"ak1" + b"body", hashlib.sha1).digest())
        assert C.acl_signature(ext, c_inner, c_outer, b"body") == want
        raw = secret.encode()  # acl_pads also hashes a long key itself
        assert C.acl_pads(raw) == C.acl_pads(raw if len(raw) <= 64 else hashlib.sha1(raw).digest())


def test_pads_are_hmacs_keyed_states() -> None:
    for secret in ("k", "k" * 64, "k" * 65, "é" * 40):
        inner, outer = S.key_pads(secret)[:2]
        inner, outer = inner.copy(), outer.copy()
        inner.update(b"msg")
        outer.update(inner.digest())
        assert outer.digest() == hmac.new(secret.encode(), b"msg", hashlib.sha1).digest()


@needs_c
@pytest.mark.parametrize("size", [1983, 1984, 1985, 2046, 2047, 2048, 3968, 4094, 4095, 34_230])
def test_bodies_fed_in_pieces_sign_whole(size: int) -> None:
    """The C feeds a body in pieces below hashlib's GIL-release size: every size at their edges signs alike."""
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ext = {"a": "PG", "b": "T", "AccessKey": "ak"}
    inner, outer, c_inner, c_outer = S.key_pads("secret")
    assert C.acl_signature(ext, inner, outer, memoryview(body)) == reference("secret", ext, body)
    assert C.acl_signature(ext, c_inner, c_outer, memoryview(body)) == reference("secret", ext, body)
