"""classCRC as RocketMQ's clients send it: UtilAll.crc32 masks the CRC32 to 31 bits
(common/src/main/java/org/apache/rocketmq/common/UtilAll.java). The filter server accepts that and the full
unsigned CRC32, for a source whose CRC32 has its top bit set (where the two differ); anything else is refused."""
from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import pytest
from filtersrv_support import write_repository

from sluice.client.selector import MessageSelector, class_source_crc
from sluice.errors import FilterClassImportError
from sluice.filtersrv.registry import FilterClassRegistry
from sluice.filtersrv.repository import ClassRepository, crc_matches
from sluice.filtersrv.sandbox import WorkerLimits


def top_bit_source() -> bytes:
    """A filter class whose source's CRC32 has bit 31 set (found by varying a comment; about one in two)."""
    for i in range(64):
        source = (f"# variant {i}\nfrom sluice.filter import MessageFilter\n\nclass All(MessageFilter):\n"
                  "    def match(self, m):\n        return True\n").encode()
        if zlib.crc32(source) & 0x80000000:
            return source
    raise AssertionError("no variant with the top CRC bit set")


SOURCE = top_bit_source()
FULL = zlib.crc32(SOURCE) & 0xFFFFFFFF
MASKED = FULL & 0x7FFFFFFF


def test_the_two_forms_differ_and_both_match() -> None:
    assert FULL != MASKED and FULL >= 2 ** 31
    assert crc_matches(FULL, SOURCE) and crc_matches(MASKED, SOURCE)
    assert crc_matches(FULL - 2 ** 32, SOURCE)  # a Java int read as signed
    assert not crc_matches(MASKED ^ 1, SOURCE) and not crc_matches(FULL ^ 0x100, SOURCE)


def test_the_sdk_sends_what_rocketmq_sends() -> None:
    assert class_source_crc(SOURCE) == MASKED
    assert MessageSelector.by_class("all:All", SOURCE).class_crc == MASKED
    assert class_source_crc(b"") == 0


@pytest.mark.parametrize("crc", [FULL, MASKED], ids=["full", "masked-31-bits"])
def test_the_registry_accepts_either_form_of_an_upload(tmp_path: Path, crc: int) -> None:
    async def run() -> None:
        reg = FilterClassRegistry(ClassRepository(write_repository(tmp_path / "repo")),
                                  WorkerLimits(memory_bytes=256 * 1024 * 1024), uploads=True)
        try:
            entry = await reg.register("G", "T", "all:All", crc, SOURCE, "a")
            assert entry.error is None and entry.worker is not None and entry.worker.alive
            with pytest.raises(FilterClassImportError, match="classCRC mismatch|is not the CRC32"):
                await reg.register("G2", "T", "all:All", MASKED ^ 1, SOURCE, "b")
        finally:
            await reg.close()
    asyncio.run(run())
