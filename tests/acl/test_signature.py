"""RocketMQ's request signature (AclClientRPCHook / AclUtils.calSignature), vectors worked by hand."""
from __future__ import annotations

import base64
import hashlib
import hmac

import orjson
import pytest

from sluice.acl.signature import (
    Credentials, compute_signature, sign_fields, signature_matches, signed_content,
)
from sluice.protocol.command import decode_header


def test_content_is_sorted_values_then_body_and_leaves_the_signature_out() -> None:
    fields = {"b": "TopicTest", "a": "PG", "AccessKey": "RocketMQ", "Signature": "old", "OnsChannel": "ALIYUN"}
    # TreeMap order: "AccessKey" < "OnsChannel" < "a" < "b" (upper case sorts before lower case).
    assert signed_content(fields, b"hello") == b"RocketMQALIYUNPGTopicTesthello"
    assert signed_content(fields, None) == b"RocketMQALIYUNPGTopicTest"


def test_a_signature_worked_by_hand() -> None:
    content = b"RocketMQ" + b"PG" + b"TopicTest" + b"hello"  # AccessKey, a, b values, then the body
    expected = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    fields = {"AccessKey": "RocketMQ", "a": "PG", "b": "TopicTest"}
    assert compute_signature("12345678", fields, b"hello") == expected
    # Pinned (openssl dgst -sha1 -hmac 12345678 over the same bytes gives it too).
    assert expected == "O8UxYrKZ95W0cZTACyBxJ0IZ1kA="


def test_values_are_rendered_as_java_string_valueof() -> None:
    # sorted keys: f, queueId, unitMode, x
    assert signed_content({"unitMode": True, "queueId": 3, "x": False, "f": 2.0}, b"") == b"23truefalse"


def test_keys_sort_by_utf16_code_units_as_java_does() -> None:
    # U+10000 is the surrogate pair D800 DC00 in Java, which sorts before U+FFFF; Python's code points disagree.
    assert signed_content({"\uffff": "late", "\U00010000": "early"}, b"") == b"earlylate"


def test_sign_fields_adds_access_key_and_signature_and_verifies() -> None:
    creds = Credentials("RocketMQ", "12345678")
    fields = {"topic": "T", "queueId": "0"}
    sign_fields(creds, fields, b"body")
    assert fields["AccessKey"] == "RocketMQ"
    assert signature_matches("12345678", fields, b"body")
    assert not signature_matches("wrong-secret", fields, b"body")
    assert not signature_matches("12345678", fields, b"other body")
    fields["topic"] = "U"
    assert not signature_matches("12345678", fields, b"body")
    sign_fields(creds, fields, b"body")  # re-signing replaces the old signature, never signs it
    assert signature_matches("12345678", fields, b"body")


def test_a_json_boolean_header_field_verifies_like_java() -> None:
    # ali-ons sends some values as JSON booleans/numbers: the server must sign over "true", not "True".
    content = b"RocketMQ" + b"true" + b"7"
    sig = base64.b64encode(hmac.new(b"12345678", content, hashlib.sha1).digest()).decode()
    header = orjson.dumps({"code": 10, "language": "JAVA", "version": 0, "opaque": 1, "flag": 0,
                           "extFields": {"AccessKey": "RocketMQ", "batch": True, "queueId": 7, "Signature": sig}})
    cmd = decode_header(0, header, b"")
    assert signature_matches("12345678", cmd.ext_fields, cmd.body)


def test_credentials_hide_the_secret_and_refuse_empty_keys() -> None:
    assert "12345678" not in repr(Credentials("RocketMQ", "12345678"))
    with pytest.raises(ValueError):
        Credentials("", "x")
    with pytest.raises(TypeError):
        Credentials("a", None)  # type: ignore[arg-type]
