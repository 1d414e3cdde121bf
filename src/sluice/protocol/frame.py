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
from sluice.protocol.command import RemotingCommand, SerializeType, decode_header, encode_header

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "NEED_DATA", "FrameCodec", "NeedData", "encode_frame", "encode_frame_parts"]

#: RocketMQ's NettyDecoder limit (com.rocketmq.remoting.frameMaxLength): 16 MiB, length prefix excluded.
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024

_PREFIX = struct.Struct(">iI")  # total length, serialize type | header length
assert _PREFIX.size == 8
_HEADER_LEN_MASK = 0xFFFFFF

# Drop consumed bytes from the buffer once this many have piled up (amortised, not per frame).
_COMPACT_AT = 64 * 1024


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


def encode_frame_parts(cmd: RemotingCommand) -> tuple[bytes, bytes]:
    """``(prefix + header, body)``: write both without joining them, so a big body is never copied."""
    header = encode_header(cmd)
    if len(header) > _HEADER_LEN_MASK:
        raise ProtocolError(f"remoting header of {len(header)} bytes exceeds the 24-bit header length field")
    total = 4 + len(header) + len(cmd.body)
    if total > 0x7FFFFFFF:
        raise ProtocolError(f"frame of {total} bytes does not fit the 32-bit length field")
    return _PREFIX.pack(total, (int(cmd.serialize_type) << 24) | len(header)) + header, cmd.body


def encode_frame(cmd: RemotingCommand) -> bytes:
    head, body = encode_frame_parts(cmd)
    return head + body if body else head


class FrameCodec:
    """Bounded incremental decoder (and encoder) for remoting frames; does no I/O.

    ``max_frame_size`` bounds the length field, so at most one frame of that
    size (plus what one read returned) is ever buffered.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must be at least 8")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side."""
        if data:
            if self._eof:
                raise ProtocolError("data received after end of stream")
            self._buf += data
        else:
            self._eof = True

    def next_frame(self) -> RemotingCommand | NeedData:
        """The next complete command, or NEED_DATA; raises ProtocolError on a malformed stream."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_frame()
        except ProtocolError as exc:
            self._error = exc
            raise

    def send(self, cmd: RemotingCommand) -> bytes:
        return encode_frame(cmd)

    def _next_frame(self) -> RemotingCommand | NeedData:
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < 4:
            return self._need(avail)
        (total,) = struct.unpack_from(">i", buf, pos)
        if total > self.max_frame_size:
            raise ProtocolError(f"frame of {total} bytes exceeds the frame size limit of {self.max_frame_size} bytes")
        if total < 4:
            raise ProtocolError(f"frame length {total} is too small (at least 4: the header-length field)")
        if avail < 4 + total:
            return self._need(avail, 4 + total)
        _, type_and_len = _PREFIX.unpack_from(buf, pos)
        serialize_type = type_and_len >> 24
        header_len = type_and_len & _HEADER_LEN_MASK
        if serialize_type not in (SerializeType.JSON, SerializeType.ROCKETMQ):
            raise ProtocolError(f"unknown header serialize type {serialize_type} (0 = JSON, 1 = ROCKETMQ)")
        if header_len > total - 4:
            raise ProtocolError(f"header length {header_len} exceeds the frame length {total} - 4")
        start = pos + 8
        body_start = start + header_len
        end = pos + 4 + total
        with memoryview(buf) as view:
            header = view[start:body_start].tobytes()
            body = view[body_start:end].tobytes()
        self._pos = end
        self._compact()
        return decode_header(serialize_type, header, body)

    def _need(self, have: int, want: int | None = None) -> NeedData:
        if self._eof and have:
            what = f"{have} of {want} bytes" if want else f"{have} bytes"
            raise ProtocolError(f"connection closed in the middle of a frame ({what} received)")
        return NEED_DATA

    def _compact(self) -> None:
        if self._pos >= _COMPACT_AT or self._pos == len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
