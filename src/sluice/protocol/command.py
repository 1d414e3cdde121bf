"""The remoting command (RemotingCommand.java) and its two header encodings. Sans-IO.

A command is one request or response: ``code``, ``language``, ``version``,
``opaque`` (the request id a response echoes), ``flag`` (bit 0 response, bit 1
oneway), ``remark``, ``ext_fields`` (the custom header, always strings on the
wire) and ``body``. Its header travels either as JSON (serialize type 0) or in
RocketMQ's binary layout (type 1)::

    code short | language byte | version short | opaque int | flag int
    | remarkLen int + remark | extLen int + { keyLen short, key, valLen int, val }*

Real 4.x clients only ever send JSON; the binary form is decoded too, and a
response is encoded in the type its request used.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

import orjson

from sluice import errors as E
from sluice.protocol.codes import ResponseCode

__all__ = [
    "FLAG_ONEWAY", "FLAG_RESPONSE", "LANGUAGE_CODES", "RemotingCommand", "SerializeType",
    "decode_header", "encode_header", "error_for_response",
]

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

#: LanguageCode.java, name -> the byte the binary header carries.
LANGUAGE_CODES: dict[str, int] = {
    "JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5, "RUBY": 6, "OTHER": 7,
    "HTTP": 8, "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12, "NODE_JS": 13,
}
_LANGUAGE_NAMES = {v: k for k, v in LANGUAGE_CODES.items()}

#: The version we announce (an MQVersion ordinal in RocketMQ's 4.x range); peers only log or ignore it.
DEFAULT_VERSION = 399


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


@dataclass(frozen=True, slots=True)
class RemotingCommand:
    """One request or response; immutable, so build replies with :meth:`make_response`."""

    code: int
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None
    opaque: int = 0
    flag: int = 0
    language: str = "PYTHON"
    version: int = DEFAULT_VERSION
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(
        cls, code: int, ext_fields: Mapping[str, Any] | None = None, body: bytes = b"", *, oneway: bool = False,
    ) -> RemotingCommand:
        """A request; ``ext_fields`` values are turned into strings the way Java's toString does."""
        return cls(code=int(code), ext_fields=stringify_fields(ext_fields or {}), body=body,
                   flag=FLAG_ONEWAY if oneway else 0)

    def make_response(
        self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
        ext_fields: Mapping[str, Any] | None = None, body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response flag set."""
        return RemotingCommand(
            code=int(code), ext_fields=stringify_fields(ext_fields or {}), body=body, remark=remark,
            opaque=self.opaque, flag=FLAG_RESPONSE, serialize_type=self.serialize_type,
        )

    def with_opaque(self, opaque: int) -> RemotingCommand:
        return replace(self, opaque=opaque)

    def raise_for_code(self) -> RemotingCommand:
        """Return self if the code is SUCCESS, else raise the matching SluiceError (remark as message)."""
        if self.code != ResponseCode.SUCCESS:
            raise error_for_response(self)
        return self

    def __repr__(self) -> str:  # bodies can be megabytes: show their size only
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        return (f"RemotingCommand({kind} code={self.code} opaque={self.opaque} remark={self.remark!r} "
                f"ext_fields={self.ext_fields!r} body={len(self.body)} bytes)")


def stringify_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    """extFields travel as strings; ``None`` is left out and booleans are ``true``/``false`` as in Java."""
    out: dict[str, str] = {}
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[str(k)] = "true" if v else "false"
        else:
            out[str(k)] = v if isinstance(v, str) else str(v)
    return out


# Codes whose meaning a single error class carries; anything else is a BrokerResponseError with the code.
_ERRORS_BY_CODE: dict[int, type[E.SluiceError]] = {
    ResponseCode.MESSAGE_ILLEGAL: E.MessageIllegalError,
    ResponseCode.INVALID_PARAMETER: E.InvalidParameterError,
    ResponseCode.TOPIC_NOT_EXIST: E.TopicNotExistError,
    ResponseCode.NO_PERMISSION: E.NoPermissionError,
    ResponseCode.SERVICE_NOT_AVAILABLE: E.ServiceNotAvailableError,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: E.FilterError,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: E.RequestCodeNotSupportedError,
}


def error_for_response(response: RemotingCommand) -> E.SluiceError:
    """The exception a client raises for an error response; ``.code`` is always the response's code."""
    message = response.remark or f"request failed with response code {response.code}"
    cls = _ERRORS_BY_CODE.get(response.code)
    if cls is None:
        return E.BrokerResponseError(message, code=response.code)
    return cls(message)


# ---------------------------------------------------------------------------------------------- JSON header

def _lenient_int(header: Mapping[str, Any], name: str, default: int) -> int:
    value = header.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool):
        raise E.ProtocolError(f"header field {name!r} must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise E.ProtocolError(f"header field {name!r} must be an integer, not {value!r}") from None


def _java_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value)


def _decode_json_header(data: bytes | memoryview, body: bytes) -> RemotingCommand:
    try:
        header = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise E.ProtocolError(f"remoting header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise E.ProtocolError(f"remoting header must be a JSON object, not {type(header).__name__}")
    if "code" not in header:
        raise E.ProtocolError("remoting header has no 'code'")
    ext = header.get("extFields") or {}
    if not isinstance(ext, dict):
        raise E.ProtocolError(f"remoting header 'extFields' must be an object, not {type(ext).__name__}")
    remark = header.get("remark")
    language = header.get("language")
    if isinstance(language, int) and not isinstance(language, bool):
        language = _LANGUAGE_NAMES.get(language, "OTHER")
    return RemotingCommand(
        code=_lenient_int(header, "code", 0),
        language=str(language) if language is not None else "JAVA",
        version=_lenient_int(header, "version", 0),
        opaque=_lenient_int(header, "opaque", 0),
        flag=_lenient_int(header, "flag", 0),
        remark=None if remark is None else _java_string(remark),
        # Real clients send string values; only convert when one is not (JSON keys are always strings).
        ext_fields=ext if all(type(v) is str for v in ext.values())
        else {k: _java_string(v) for k, v in ext.items() if v is not None},
        body=body,
        serialize_type=SerializeType.JSON,
    )


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": cmd.code, "language": cmd.language, "version": cmd.version,
        "opaque": cmd.opaque, "flag": cmd.flag,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["extFields"] = cmd.ext_fields
    header["serializeTypeCurrentRPC"] = "JSON"
    return orjson.dumps(header)


# ------------------------------------------------------------------------------------ ROCKETMQ binary header

_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
assert _FIXED.size == 13
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")


def _decode_binary_header(data: bytes | memoryview, body: bytes) -> RemotingCommand:
    buf = bytes(data)
    end = len(buf)
    if end < _FIXED.size + 4:
        raise E.ProtocolError(f"binary remoting header is {end} bytes; it needs at least {_FIXED.size + 8}")
    code, lang, version, opaque, flag = _FIXED.unpack_from(buf, 0)
    pos = _FIXED.size

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > end:
            raise E.ProtocolError(f"binary remoting header: {what} of {n} bytes runs past the header end ({end})")
        out = buf[pos:pos + n]
        pos += n
        return out

    def text(raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise E.ProtocolError(f"binary remoting header: {what} is not UTF-8") from None

    (remark_len,) = _I32.unpack(take(4, "remark length"))
    remark = text(take(remark_len, "remark"), "remark") if remark_len > 0 else None
    (ext_len,) = _I32.unpack(take(4, "extFields length"))
    ext_end = pos + ext_len
    if ext_len < 0 or ext_end > end:
        raise E.ProtocolError(f"binary remoting header: extFields of {ext_len} bytes runs past the header end")
    ext: dict[str, str] = {}
    while pos < ext_end:
        (klen,) = _U16.unpack(take(2, "key length"))
        key = text(take(klen, "key"), "key")
        (vlen,) = _I32.unpack(take(4, "value length"))
        ext[key] = text(take(vlen, "value"), "value")
    if pos != end:
        raise E.ProtocolError(f"binary remoting header: {end - pos} stray bytes after extFields")
    return RemotingCommand(
        code=code, language=_LANGUAGE_NAMES.get(lang, "OTHER"), version=version, opaque=opaque, flag=flag,
        remark=remark, ext_fields=ext, body=body, serialize_type=SerializeType.ROCKETMQ,
    )


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    for name, value, lo, hi in (("code", cmd.code, -32768, 32767), ("version", cmd.version, -32768, 32767),
                                ("opaque", cmd.opaque, -2**31, 2**31 - 1), ("flag", cmd.flag, -2**31, 2**31 - 1)):
        if not lo <= value <= hi:
            raise E.ProtocolError(f"{name} {value} does not fit the binary remoting header")
    parts = [_FIXED.pack(cmd.code, LANGUAGE_CODES.get(cmd.language, LANGUAGE_CODES["OTHER"]),
                         cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode("utf-8")
    parts += [_I32.pack(len(remark)), remark]
    ext_parts = []
    for k, v in cmd.ext_fields.items():
        kb, vb = k.encode("utf-8"), v.encode("utf-8")
        if len(kb) > 0xFFFF:
            raise E.ProtocolError(f"extFields key of {len(kb)} bytes does not fit the binary header")
        ext_parts += [_U16.pack(len(kb)), kb, _I32.pack(len(vb)), vb]
    ext = b"".join(ext_parts)
    parts += [_I32.pack(len(ext)), ext]
    return b"".join(parts)


# --------------------------------------------------------------------------------------------- entry points

def decode_header(serialize_type: int, data: bytes | memoryview, body: bytes) -> RemotingCommand:
    if serialize_type == SerializeType.JSON:
        return _decode_json_header(data, body)
    if serialize_type == SerializeType.ROCKETMQ:
        return _decode_binary_header(data, body)
    raise E.ProtocolError(f"unknown header serialize type {serialize_type} (0 = JSON, 1 = ROCKETMQ)")


def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        return _encode_binary_header(cmd)
    return _encode_json_header(cmd)
