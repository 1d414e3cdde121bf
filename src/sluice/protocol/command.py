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
from sluice.speedups import C

__all__ = [
    "FLAG_ONEWAY", "FLAG_RESPONSE", "LANGUAGE_CODES", "RemotingCommand", "SerializeType",
    "decode_header", "encode_header", "encode_header_as", "error_for_response",
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
        fields = stringify_fields(ext_fields) if ext_fields else {}
        flag = FLAG_ONEWAY if oneway else 0
        if cls is RemotingCommand:
            return _command(int(code), fields, body, None, 0, flag, "PYTHON", DEFAULT_VERSION, _JSON)
        return cls(code=int(code), ext_fields=fields, body=body, flag=flag)

    def make_response(
        self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
        ext_fields: Mapping[str, Any] | None = None, body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response flag set."""
        return _command(int(code), stringify_fields(ext_fields) if ext_fields else {}, body, remark,
                        self.opaque, FLAG_RESPONSE, "PYTHON", DEFAULT_VERSION, self.serialize_type)

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


# A frozen dataclass's __init__ sets each field through object.__setattr__; the slot descriptors' own
# setters do the same job faster on the hot paths (decoding every frame, every make_response;
# docs/protocol.md has the figures).
_new_object = object.__new__
(_set_code, _set_ext, _set_body, _set_remark, _set_opaque, _set_flag, _set_language, _set_version,
 _set_stype) = (RemotingCommand.__dict__[name].__set__ for name in (
     "code", "ext_fields", "body", "remark", "opaque", "flag", "language", "version", "serialize_type"))


def _command(code: int, ext_fields: dict[str, str], body: bytes, remark: str | None, opaque: int, flag: int,
             language: str, version: int, serialize_type: SerializeType) -> RemotingCommand:
    """``RemotingCommand(...)`` with every field given, without the frozen __init__'s cost."""
    cmd = _new_object(RemotingCommand)
    _set_code(cmd, code)
    _set_ext(cmd, ext_fields)
    _set_body(cmd, body)
    _set_remark(cmd, remark)
    _set_opaque(cmd, opaque)
    _set_flag(cmd, flag)
    _set_language(cmd, language)
    _set_version(cmd, version)
    _set_stype(cmd, serialize_type)
    return cmd


def stringify_fields(fields: Mapping[str, Any]) -> dict[str, str]:
    """extFields travel as strings; ``None`` is left out and booleans are ``true``/``false`` as in Java."""
    out: dict[str, str] = {}
    for k, v in fields.items():
        if type(v) is str and type(k) is str:  # the common case first
            out[k] = v
        elif v is None:
            continue
        elif isinstance(v, bool):
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


_STR_ONLY = frozenset((str,))
#: speedups.json_command (src/csrc/speedups/command.c), or None: the Python lines after it are its reference.
_json_command = getattr(C, "json_command", None) if C is not None else None
_JSON = SerializeType.JSON
_ROCKETMQ = SerializeType.ROCKETMQ


def _decode_json_header(data: bytes | memoryview, body: bytes) -> RemotingCommand:
    try:
        header = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise E.ProtocolError(f"remoting header is not valid JSON: {exc}") from None
    if type(header) is not dict:
        raise E.ProtocolError(f"remoting header must be a JSON object, not {type(header).__name__}")
    if _json_command is not None:  # C's twin of the usual case below, one call per frame (None: not usual)
        cmd = _json_command(RemotingCommand, header, body, _JSON)
        if cmd is not None:
            return cmd
    # Fast path for what real clients send: int numbers, string language/remark, string extFields values.
    get = header.get
    code, version, opaque, flag = get("code"), get("version", 0), get("opaque", 0), get("flag", 0)
    language, remark, ext = get("language"), get("remark"), get("extFields")
    if (type(code) is not int or type(version) is not int or type(opaque) is not int or type(flag) is not int
            or type(language) is not str or (remark is not None and type(remark) is not str)
            or (type(ext) is not dict and ext is not None)
            or (ext and not set(map(type, ext.values())) <= _STR_ONLY)):
        return _decode_json_lenient(header, body)
    # _command's body inlined: every JSON frame received is decoded here, so the call is saved per frame.
    cmd = _new_object(RemotingCommand)
    if ext is None:  # Java's fastjson leaves a null extFields out
        ext = {}
    _set_code(cmd, code)
    _set_ext(cmd, ext)
    _set_body(cmd, body)
    _set_remark(cmd, remark)
    _set_opaque(cmd, opaque)
    _set_flag(cmd, flag)
    _set_language(cmd, language)
    _set_version(cmd, version)
    _set_stype(cmd, _JSON)
    return cmd


def _decode_json_lenient(header: dict[str, Any], body: bytes) -> RemotingCommand:
    """Numbers as strings, extFields values of any scalar type, missing fields defaulted."""
    if "code" not in header:
        raise E.ProtocolError("remoting header has no 'code'")
    ext = header.get("extFields") or {}
    if not isinstance(ext, dict):
        raise E.ProtocolError(f"remoting header 'extFields' must be an object, not {type(ext).__name__}")
    code = _lenient_int(header, "code", 0)
    version = _lenient_int(header, "version", 0)
    opaque = _lenient_int(header, "opaque", 0)
    flag = _lenient_int(header, "flag", 0)
    remark = header.get("remark")
    language = header.get("language")
    if isinstance(language, int) and not isinstance(language, bool):
        language = _LANGUAGE_NAMES.get(language, "OTHER")
    # JSON keys are always strings; values are converted only when one is not a string.
    if not all(type(v) is str for v in ext.values()):
        ext = {k: _java_string(v) for k, v in ext.items() if v is not None}
    return _command(code, ext, body, None if remark is None else _java_string(remark), opaque, flag,
                    str(language) if language is not None else "JAVA", version, _JSON)


def _encode_json_header(code: int, language: str, version: int, opaque: int, flag: int, remark: str | None,
                        ext_fields: Mapping[str, str]) -> bytes:
    if remark is None:
        return orjson.dumps({"code": code, "language": language, "version": version, "opaque": opaque,
                             "flag": flag, "extFields": ext_fields, "serializeTypeCurrentRPC": "JSON"})
    return orjson.dumps({"code": code, "language": language, "version": version, "opaque": opaque, "flag": flag,
                         "remark": remark, "extFields": ext_fields, "serializeTypeCurrentRPC": "JSON"})


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
    return _command(code, ext, body, remark, opaque, flag, _LANGUAGE_NAMES.get(lang, "OTHER"), version, _ROCKETMQ)


def _encode_binary_header(cmd: RemotingCommand, opaque: int, flag: int) -> bytes:
    for name, value, lo, hi in (("code", cmd.code, -32768, 32767), ("version", cmd.version, -32768, 32767),
                                ("opaque", opaque, -2**31, 2**31 - 1), ("flag", flag, -2**31, 2**31 - 1)):
        if not lo <= value <= hi:
            raise E.ProtocolError(f"{name} {value} does not fit the binary remoting header")
    parts = [_FIXED.pack(cmd.code, LANGUAGE_CODES.get(cmd.language, LANGUAGE_CODES["OTHER"]),
                         cmd.version, opaque, flag)]
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
    if serialize_type == 0:
        return _decode_json_header(data, body)
    if serialize_type == 1:
        return _decode_binary_header(data, body)
    raise E.ProtocolError(f"unknown header serialize type {serialize_type} (0 = JSON, 1 = ROCKETMQ)")


def encode_header(cmd: RemotingCommand) -> bytes:
    if cmd.serialize_type == 1:
        return _encode_binary_header(cmd, cmd.opaque, cmd.flag)
    return _encode_json_header(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields)


def encode_header_as(cmd: RemotingCommand, opaque: int, flag: int, serialize_type: int) -> bytes:
    """The header of ``cmd`` with another opaque, flag and serialize type: what ``encode_header(replace(cmd,
    opaque=, flag=, serialize_type=))`` gives, without building the copy (the transport's send path)."""
    if serialize_type == 1:
        return _encode_binary_header(cmd, opaque, flag)
    return _encode_json_header(cmd.code, cmd.language, cmd.version, opaque, flag, cmd.remark, cmd.ext_fields)
