"""An in-memory transport for RemotingConnection tests, which records what is written to it (the test plays
the kernel), and the framing helpers that go with it."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable

from sluice.protocol.command import RemotingCommand
from sluice.protocol.frame import NEED_DATA, FrameCodec, encode_frame_head


class RecordingTransport(asyncio.Transport):
    """Keeps every write in ``writes``; with a shared ``log``, also appends ``(name, data)`` to it, so a test
    sees the order of writes across transports."""

    def __init__(self, name: str = "", log: list[tuple[str, object]] | None = None) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.writes: list[bytes] = []
        self.conn: asyncio.BaseProtocol | None = None

    def connect(self, conn: asyncio.BaseProtocol) -> None:
        """``conn.connection_made(self)``; a close then tells ``conn`` it is lost, as a socket's transport does
        (a broker's stop waits for its connections to be)."""
        self.conn = conn
        conn.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        self.writes.append(data)
        if self.log is not None:
            self.log.append((self.name, data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            asyncio.get_running_loop().call_soon(conn.connection_lost, None)

    def take(self) -> list[RemotingCommand]:
        """The frames written so far, decoded; they are forgotten."""
        out = frames(self.writes)
        self.writes.clear()
        return out


def frames(data: bytes | Iterable[bytes]) -> list[RemotingCommand]:
    """Every whole frame in ``data`` (bytes, or the writes of a transport)."""
    codec = FrameCodec()
    codec.receive_data(data if isinstance(data, bytes) else b"".join(data))
    out = []
    while (frame := codec.next_frame()) is not NEED_DATA:
        out.append(frame)
    return out


def wire(cmd: RemotingCommand, opaque: int) -> bytes:
    """``cmd`` as a peer would send it with ``opaque``."""
    return encode_frame_head(cmd, opaque, cmd.flag, cmd.serialize_type) + (cmd.body or b"")
