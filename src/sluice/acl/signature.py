"""RocketMQ's request signature (acl/src/main/java/org/apache/rocketmq/acl/common/AclClientRPCHook.java,
AclUtils.java), sans-IO: one function signs (the SDK) and verifies (the servers).

The signed content is the values of every extField except ``Signature``, sorted by key as Java's TreeMap
sorts strings, concatenated with no separator, then the body. The signature is base64(HmacSHA1(secretKey,
content)) in extField ``Signature``; the key travels in ``AccessKey``, never the secret.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ACCESS_KEY", "SIGNATURE", "Credentials", "signed_content", "compute_signature", "sign_fields",
           "signature_matches"]

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


def _signed_head(ext_fields: Mapping[str, Any]) -> bytes:
    """The extField values in signing order (``Signature`` and null values left out), UTF-8."""
    keys = [k for k, v in ext_fields.items() if k != SIGNATURE and v is not None]
    # ASCII keys (every real client's) sort the same by code points as by UTF-16 code units.
    keys = sorted(keys) if "".join(keys).isascii() else sorted(keys, key=_java_key)
    return "".join([_java_string(ext_fields[k]) for k in keys]).encode("utf-8")


def signed_content(ext_fields: Mapping[str, Any], body: bytes | None) -> bytes:
    """The bytes RocketMQ signs: sorted extField values (``Signature`` left out, null values too), then the body."""
    head = _signed_head(ext_fields)
    return head + bytes(body) if body else head


def compute_signature(secret_key: str, ext_fields: Mapping[str, Any], body: bytes | None) -> str:
    mac = hmac.new(secret_key.encode("utf-8"), _signed_head(ext_fields), hashlib.sha1)
    if body:
        mac.update(body)  # the body is signed after the header values, without copying it onto them
    return base64.b64encode(mac.digest()).decode("ascii")


def sign_fields(credentials: Credentials, ext_fields: dict[str, str], body: bytes | None) -> None:
    """Add ``AccessKey`` and ``Signature`` to a request's extFields in place (AclClientRPCHook.doBeforeRequest)."""
    ext_fields.pop(SIGNATURE, None)
    ext_fields[ACCESS_KEY] = credentials.access_key
    ext_fields[SIGNATURE] = compute_signature(credentials.secret_key, ext_fields, body)


def signature_matches(secret_key: str, ext_fields: Mapping[str, Any], body: bytes | None) -> bool:
    """Whether the request's ``Signature`` is right for ``secret_key`` (compared in constant time)."""
    given = ext_fields.get(SIGNATURE)
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"),
                               compute_signature(secret_key, ext_fields, body).encode("ascii"))
