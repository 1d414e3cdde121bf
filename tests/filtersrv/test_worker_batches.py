"""A worker's batches travel through its shared memory file, or down the pipe when larger than the file
(or with no file): the same decisions either way, the server's own copy of the batch untouched."""
from __future__ import annotations

import asyncio
import os

import pytest

from sluice.filtersrv import sandbox as S
from sluice.protocol import properties as P
from sluice.protocol.record import encode_record

SOURCE = b'''from sluice.filter import MessageFilter


class Below(MessageFilter):
    def match(self, message):
        return int(message.properties["k"]) < 3 and message.body.startswith(b"b")
'''


def batch(n: int, body: bytes = b"b") -> bytes:
    return b"".join(bytes(encode_record(topic="T", body=body, properties=P.encode_properties({"k": str(i % 10)}),
                                        queue_offset=i)) for i in range(n))


def want(n: int) -> bytes:
    return bytes(1 if i % 10 < 3 else 0 for i in range(n))


async def _run(shared: bool) -> None:
    w = S.Worker("filters:Below", SOURCE, S.WorkerLimits())
    await w.start()
    try:
        assert (w._shared is not None) == shared
        small = batch(50)
        copy = bytes(small)
        assert await w.filter(small, 50) == want(50)
        assert small == copy
        big = batch(1000, b"b" * 5000)  # over BATCH_BYTES: down the pipe
        assert len(big) > S.BATCH_BYTES
        assert await w.filter(big, 1000) == want(1000)
        assert await w.filter(batch(7), 7) == want(7)  # and the file again after it
        assert await w.filter(b"", 0) == b""
    finally:
        await w.kill()


def test_batches_through_the_shared_file_and_the_pipe():
    fd = S._batch_file()
    if fd is None:
        pytest.skip("no memfd here")
    os.close(fd)
    asyncio.run(_run(True))


def test_batches_down_the_pipe_without_a_file(monkeypatch):
    monkeypatch.setattr(S, "_batch_file", lambda: None)
    asyncio.run(_run(False))
