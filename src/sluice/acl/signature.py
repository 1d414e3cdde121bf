"""RocketMQ's request signature (acl/src/main/java/org/apache/rocketmq/acl/common/AclClientRPCHook.java,
AclUtils.java), sans-IO: one function signs (the SDK) and verifies (the servers).

The signed content is the values of every extField except ``Signature``, sorted by key as Java's TreeMap
sorts strings, concatenated with no separator, then the body. The signature is base64(HmacSHA1(secretKey,
content)) in extField ``Signature``; the key travels in ``AccessKey``, never the secret.
"""
from __future__ import annotations

import hashlib
from hmac import compare_digest as _compare
from binascii import b2a_base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from sluice.speedups import C

__all__ = ["ACCESS_KEY", "SIGNATURE", "Credentials", "Pads", "signed_content", "compute_signature", "sign_fields",
           "signature_matches", "signature_valid", "key_pads", "signature_b64"]

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"


@dataclass(frozen=True, slots=True)
class Credentials:
    """An ACL account's keys, given to ``Producer``/``PullConsumer``/``PushConsumer`` as ``credentials=``."""

    access_key: str
    secret_key: str

    def __post_init__(self) -> None:
        if not isinstance(self.access_key, str) or not isinstance(self.secret_key, str):
            raise TypeError("Credentials(access_key, secret_key) takes two strings")
        if not self.access_key or not self.secret_key:
            raise ValueError("Credentials need a non-empty access_key and secret_key")

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(access_key={self.access_key!r}, secret_key=<hidden>)"


def _java_string(value: Any) -> str:
    """A header value as Java's String.valueOf renders it (clients send some as JSON booleans or numbers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        return str(int(value))
    return value if isinstance(value, str) else str(value)


def _java_key(key: str) -> list[int]:
    # Java compares strings by UTF-16 code units; Python by code points. They differ only above the BMP.
    data = key.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


#: The signing order of each request shape seen (its extField names in the order they came, which a client
#: repeats request after request): sorting once per shape, not per request, is most of a verification's
#: Python work. Bounded: past _MAX_SHAPES distinct shapes the memory starts over (a peer inventing shapes
#: only costs itself the sort each request paid before).
_ORDER: dict[tuple[str, ...], tuple[list[str], Callable[[Mapping[str, Any]], Any]]] = {}
_MAX_SHAPES = 4096


def _signing_order(ext_fields: Mapping[str, Any]) -> tuple[list[str], Callable[[Mapping[str, Any]], Any]]:
    """The signed keys in order, and a getter of their values (one C call for all of them)."""
    shape = tuple(ext_fields)
    order = _ORDER.get(shape)
    if order is None:
        keys = [k for k in shape if k != SIGNATURE]
        # ASCII keys (every real client's) sort the same by code points as by UTF-16 code units.
        keys = sorted(keys) if "".join(keys).isascii() else sorted(keys, key=_java_key)
        getter = itemgetter(*keys) if len(keys) > 1 else (lambda ext, ks=tuple(keys): [ext[k] for k in ks])
        order = (keys, getter)
        if len(_ORDER) >= _MAX_SHAPES:
            _ORDER.clear()
        _ORDER[shape] = order
    return order


def _signed_head(ext_fields: Mapping[str, Any]) -> bytes:
    """The extField values in signing order (``Signature`` and null values left out), UTF-8."""
    keys, values = _signing_order(ext_fields)
    try:
        return "".join(values(ext_fields)).encode("utf-8")
    except TypeError:  # a null or a non-string value (JSON numbers, booleans): as Java renders it
        return "".join([_java_string(ext_fields[k]) for k in keys if ext_fields[k] is not None]).encode("utf-8")


def signed_content(ext_fields: Mapping[str, Any], body: bytes | None) -> bytes:
    """The bytes RocketMQ signs: sorted extField values (``Signature`` left out, null values too), then the body."""
    head = _signed_head(ext_fields)
    return head + bytes(body) if body else head


#: Per secret key, SHA-1 states with HMAC's inner and outer pads already absorbed (RFC 2104): a signature
#: then copies two states instead of keying a new HMAC, the same digest for less work. Four: hashlib's
#: (the Python twin's), then the C functions' (``_speedups.acl_pads``' OpenSSL states when the extension
#: has them, else hashlib's again). Bounded like _ORDER.
Pads = tuple[Any, Any, Any, Any]
_PADS: dict[str, Pads] = {}
_MAX_KEYS = 1024
_sha1 = hashlib.sha1


def key_pads(secret_key: str) -> Pads:
    """HMAC-SHA1's keyed inner and outer states for ``secret_key`` (remembered; never mutated, only copied)."""
    pads = _PADS.get(secret_key)
    if pads is None:
        key = secret_key.encode("utf-8")
        if len(key) > 64:  # SHA-1's block size: a longer key is hashed first
            key = _sha1(key).digest()
        key = key.ljust(64, b"\0")
        inner, outer = _sha1(bytes(b ^ 0x36 for b in key)), _sha1(bytes(b ^ 0x5C for b in key))
        native = _c_pads(key) if _c_pads is not None else None
        pads = (inner, outer, *native) if native is not None else (inner, outer, inner, outer)
        if len(_PADS) >= _MAX_KEYS:
            _PADS.clear()
        _PADS[secret_key] = pads
    return pads


def _py_signature(ext_fields: Mapping[str, Any], inner_pad: Any, outer_pad: Any, body: bytes | None) -> bytes:
    """The Python twin of the C ``acl_signature``: base64 of HMAC-SHA1 over the signed head, then the body."""
    inner = inner_pad.copy()
    inner.update(_signed_head(ext_fields))
    if body:
        inner.update(body)  # the body is signed after the header values, without copying it onto them
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return b2a_base64(outer.digest(), newline=False)


# The C twins (sluice._speedups.acl_signature, acl_sign, acl_verify) do the same in one call each, answering
# None (False for acl_sign) where the head needs Python (non-ASCII keys, non-string values), so a signature
# costs the hashing and little else, on the client and on the server.
_c_signature = getattr(C, "acl_signature", None) if C is not None else None
_c_pads = getattr(C, "acl_pads", None) if C is not None else None
_c_sign = getattr(C, "acl_sign", None) if C is not None else None
_c_verify = getattr(C, "acl_verify", None) if C is not None else None


def signature_b64(pads: Pads, ext_fields: Mapping[str, Any], body: bytes | None) -> bytes:
    """base64(HmacSHA1) of a request for the key whose ``key_pads`` these are, as ASCII bytes."""
    if _c_signature is not None:
        sig = _c_signature(ext_fields, pads[2], pads[3], body)
        if sig is not None:
            return sig
    return _py_signature(ext_fields, pads[0], pads[1], body)


def compute_signature(secret_key: str, ext_fields: Mapping[str, Any], body: bytes | None) -> str:
    return signature_b64(key_pads(secret_key), ext_fields, body).decode("ascii")


def sign_fields(credentials: Credentials, ext_fields: dict[str, str], body: bytes | None) -> None:
    """Add ``AccessKey`` and ``Signature`` to a request's extFields in place (AclClientRPCHook.doBeforeRequest)."""
    pads = _PADS.get(credentials.secret_key) or key_pads(credentials.secret_key)
    if _c_sign is not None and _c_sign(ext_fields, credentials.access_key, pads[2], pads[3], body):
        return
    ext_fields.pop(SIGNATURE, None)
    ext_fields[ACCESS_KEY] = credentials.access_key
    ext_fields[SIGNATURE] = _py_signature(ext_fields, pads[0], pads[1], body).decode("ascii")


def _py_valid(pads: Pads, ext_fields: Mapping[str, Any], body: bytes | None) -> bool:
    """The Python twin of the C ``acl_verify``."""
    given = ext_fields.get(SIGNATURE)
    if not isinstance(given, str):
        return False
    return _compare(given.encode("utf-8", "replace"), _py_signature(ext_fields, pads[0], pads[1], body))


def signature_valid(pads: Pads, ext_fields: Mapping[str, Any], body: bytes | None) -> bool:
    """Whether the request's ``Signature`` is right for the key whose ``key_pads`` these are (constant time)."""
    if _c_verify is not None:
        ok = _c_verify(ext_fields, pads[2], pads[3], body)
        if ok is not None:
            return ok
    return _py_valid(pads, ext_fields, body)


def signature_matches(secret_key: str, ext_fields: Mapping[str, Any], body: bytes | None,
                      pads: Pads | None = None) -> bool:
    """Whether the request's ``Signature`` is right for ``secret_key`` (compared in constant time); ``pads``,
    when given, are ``key_pads(secret_key)`` already at hand."""
    return signature_valid(key_pads(secret_key) if pads is None else pads, ext_fields, body)
