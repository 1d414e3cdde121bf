"""Remoting frames and an incremental, sans-IO frame codec in h11's style.

A frame (big-endian)::

    int length                     = 4 + header length + body length (it does not count itself)
    int serializeType<<24 | headerLength
    header bytes                   (JSON or ROCKETMQ binary, see sluice.protocol.command)
    body bytes

Use :class:`FrameCodec`: feed it whatever the socket gave with
:meth:`~FrameCodec.receive_data`, then call :meth:`~FrameCodec.next_frame`
until it returns :data:`NEED_DATA`. Anything malformed raises
:class:`~sluice.errors.ProtocolError`, after which the codec stays broken
(the stream cannot be resynchronised, so the connection must be closed).
"""
from __future__ import annotations

import struct
from typing import Final

from sluice.errors import ProtocolError
import orjson

from sluice.protocol.command import RemotingCommand, _decode_json_header, decode_header, encode_header_as

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE", "NEED_DATA", "FrameCodec", "NeedData", "encode_frame", "encode_frame_head",
    "encode_frame_parts",
]

#: RocketMQ's NettyDecoder limit (com.rocketmq.remoting.frameMaxLength): 16 MiB, length prefix excluded.
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024

_PREFIX = struct.Struct(">iI")  # total length, serialize type | header length
assert _PREFIX.size == 8
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_HEADER_LEN_MASK = 0xFFFFFF
_dumps = orjson.dumps

# A frame at least this long that is not all here yet has its body collected as a list of chunks
# and joined once (one copy), rather than grown in a bytearray and sliced out (two or three).
_COLLECT_AT = 128 * 1024


class NeedData:
    """Sentinel type: more bytes are needed before the next frame is complete."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


def encode_frame_head(cmd: RemotingCommand, opaque: int, flag: int, serialize_type: int) -> bytes:
    """Length prefix + header of ``cmd`` sent with the given opaque, flag and serialize type (not its body).

    The transport uses this to send a request under its own opaque, or a response with its request's
    opaque and serialize type, without copying the command."""
    if serialize_type == 0:  # JSON, what every real client speaks: inlined encode_header_as
        if cmd.remark is None:
            header = _dumps({"code": cmd.code, "language": cmd.language, "version": cmd.version, "opaque": opaque,
                             "flag": flag, "extFields": cmd.ext_fields, "serializeTypeCurrentRPC": "JSON"})
        else:
            header = encode_header_as(cmd, opaque, flag, 0)
    else:
        header = encode_header_as(cmd, opaque, flag, serialize_type)
    header_len = len(header)
    if header_len > _HEADER_LEN_MASK:
        raise ProtocolError(f"remoting header of {header_len} bytes exceeds the 24-bit header length field")
    total = 4 + header_len + len(cmd.body)
    if total > 0x7FFFFFFF:
        raise ProtocolError(f"frame of {total} bytes does not fit the 32-bit length field")
    return _PREFIX.pack(total, (serialize_type << 24) | header_len if serialize_type else header_len) + header


def encode_frame_parts(cmd: RemotingCommand) -> tuple[bytes, bytes]:
    """``(prefix + header, body)``: write both without joining them, so a big body is never copied."""
    return encode_frame_head(cmd, cmd.opaque, cmd.flag, cmd.serialize_type), cmd.body


def encode_frame(cmd: RemotingCommand) -> bytes:
    head, body = encode_frame_parts(cmd)
    return head + body if body else head


class FrameCodec:
    """Bounded incremental decoder (and encoder) for remoting frames; does no I/O.

    ``max_frame_size`` bounds the length field, so at most one frame of that
    size (plus what one read returned) is ever buffered.

    Copies are kept down because every frame goes through here: bytes handed to
    :meth:`receive_data` are kept as they are while nothing is left over (a read
    holding whole frames is sliced directly), and a big frame's body is collected
    as a list of the received chunks and joined once when it is complete.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must be at least 8")
        self.max_frame_size = max_frame_size
        self._buf: bytes | bytearray = b""  # unconsumed input starts at _pos
        self._pos = 0
        self._eof = False
        self._error: ProtocolError | None = None
        # A big frame being collected: its serialize type and header, the body chunks so far, bytes still due.
        self._big: tuple[int, bytes] | None = None
        self._big_chunks: list[bytes | memoryview] = []
        self._big_due = 0
        self._big_total = 0
        self._big_done: RemotingCommand | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        held = len(self._buf) - self._pos
        if self._big is not None:
            held += self._big_total - self._big_due
        return held

    @property
    def partial_frame_size(self) -> int:
        """Bytes (length prefix included) of the frame being received, as its length field declares;
        0 when no frame is under way, or while fewer than 4 of its bytes are here."""
        if self._big is not None:
            return self._big_total
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return 0
        return 4 + _I32.unpack_from(buf, pos)[0]

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise ProtocolError("data received after end of stream")
        if self._error is not None:
            return  # a broken stream is not parsed further
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer; we keep references
        if self._big is not None:
            self._collect(data)
            return
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            self._buf, self._pos = data, 0
        elif type(buf) is bytearray:
            if pos:
                del buf[:pos]  # cheap: bytearray drops a prefix by moving its start
                self._pos = 0
            buf += data
        else:
            joined = bytearray(memoryview(buf)[pos:])
            joined += data
            self._buf, self._pos = joined, 0

    def next_frame(self) -> RemotingCommand | NeedData:
        """The next complete command, or NEED_DATA; raises ProtocolError on a malformed stream."""
        if self._error is not None:
            raise self._error
        try:
            buf, pos = self._buf, self._pos
            # Fast path: a whole, well-formed JSON frame sliced from received bytes. Everything else
            # (partial, binary, bytearray buffer, big, malformed) takes _next_frame with its checks.
            if len(buf) - pos >= 8 and self._big is None and type(buf) is bytes:
                total, type_and_len = _PREFIX.unpack_from(buf, pos)
                end = pos + 4 + total
                if 4 <= total <= self.max_frame_size and end <= len(buf) and type_and_len <= total - 4 \
                        and type_and_len <= _HEADER_LEN_MASK:
                    body_start = pos + 8 + type_and_len  # serialize type 0: the int is the header length
                    if end == len(buf):
                        self._buf, self._pos = b"", 0
                    else:
                        self._pos = end
                    return _decode_json_header(buf[pos + 8:body_start], buf[body_start:end])
            return self._next_frame()
        except ProtocolError as exc:
            self._error = exc
            raise

    def send(self, cmd: RemotingCommand) -> bytes:
        return encode_frame(cmd)

    def _next_frame(self) -> RemotingCommand | NeedData:
        if self._big is not None:
            done = self._big_done
            if done is None:
                if self._eof:
                    got = self._big_total - self._big_due
                    raise ProtocolError(f"connection closed in the middle of a frame ({got} of "
                                        f"{self._big_total} bytes received)")
                return NEED_DATA
            self._big, self._big_done = None, None
            return done
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < 4:
            return self._need(avail)
        total = _I32.unpack_from(buf, pos)[0]
        if total > self.max_frame_size:
            raise ProtocolError(f"frame of {total} bytes exceeds the frame size limit of {self.max_frame_size} bytes"
                                + _foreign_protocol_hint(bytes(buf[pos:pos + 4])))
        if total < 4:
            raise ProtocolError(f"frame length {total} is too small (at least 4: the header-length field)")
        end = pos + 4 + total
        if avail < 4 + total and (total < _COLLECT_AT or avail < 8):
            return self._need(avail, 4 + total)
        type_and_len = _U32.unpack_from(buf, pos + 4)[0]
        serialize_type = type_and_len >> 24
        header_len = type_and_len & _HEADER_LEN_MASK
        if serialize_type > 1:
            raise ProtocolError(f"unknown header serialize type {serialize_type} (0 = JSON, 1 = ROCKETMQ)")
        if header_len > total - 4:
            raise ProtocolError(f"header length {header_len} exceeds the frame length {total} - 4")
        body_start = pos + 8 + header_len
        if avail < 4 + total:  # a big frame: collect its body chunk by chunk once its header is here
            if body_start > len(buf):
                return self._need(avail, 4 + total)
            self._start_big(serialize_type, bytes(buf[pos + 8:body_start]), body_start, total)
            return self._next_frame()
        if type(buf) is bytes:
            header = buf[pos + 8:body_start]
            body = buf[body_start:end]
        else:
            with memoryview(buf) as view:
                header = view[pos + 8:body_start].tobytes()
                body = view[body_start:end].tobytes()
        if end >= len(buf):
            self._buf, self._pos = b"", 0  # all consumed: drop the reference to the old input
        else:
            self._pos = end
        if serialize_type == 0:
            return _decode_json_header(header, body)
        return decode_header(serialize_type, header, body)

    def _start_big(self, serialize_type: int, header: bytes, body_start: int, total: int) -> None:
        buf = self._buf
        self._big = (serialize_type, header)
        self._big_total = 4 + total
        self._big_due = 4 + total - (len(buf) - self._pos)
        rest = memoryview(buf)[body_start:] if type(buf) is bytes else bytes(buf[body_start:])
        self._big_chunks = [rest] if len(rest) else []
        self._buf, self._pos = b"", 0

    def _collect(self, data: bytes) -> None:
        due = self._big_due
        if len(data) < due:
            self._big_chunks.append(data)
            self._big_due = due - len(data)
            return
        chunks = self._big_chunks
        chunks.append(memoryview(data)[:due] if len(data) > due else data)
        serialize_type, header = self._big  # type: ignore[misc]
        body = chunks[0] if len(chunks) == 1 and type(chunks[0]) is bytes else b"".join(chunks)
        self._big_chunks, self._big_due = [], 0
        self._buf, self._pos = data, due
        try:
            self._big_done = decode_header(serialize_type, header, body)  # type: ignore[arg-type]
        except ProtocolError as exc:
            self._error = exc  # raised by the next next_frame, as for any frame

    def _need(self, have: int, want: int | None = None) -> NeedData:
        if self._eof and have:
            what = f"{have} of {want} bytes" if want else f"{have} bytes"
            raise ProtocolError(f"connection closed in the middle of a frame ({what} received)")
        return NEED_DATA


def _foreign_protocol_hint(first: bytes) -> str:
    """A "length" that is four printable ASCII bytes is text: the peer speaks another protocol (an HTTP server or
    proxy answers b'HTTP', a browser or curl sends b'GET '), usually a wrong address; say so instead of leaving
    only an absurd frame size."""
    if len(first) == 4 and all(0x20 <= b < 0x7F for b in first):
        return (f"; it starts with {first.decode('ascii')!r}: the peer speaks a text protocol (HTTP?), not "
                "RocketMQ remoting: check the address")
    return ""
