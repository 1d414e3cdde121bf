"""Where filter classes come from when uploads are off: a directory of modules the operator keeps.

``module:ClassName`` is looked up as ``DIR/module.py`` (a dotted module as
``DIR/pkg/mod.py``). The filter server reads the file's bytes and their CRC32;
it never imports them itself (a worker does, sluice/filtersrv/worker.py).
RocketMQ fetched ``filterClassRepertoryUrl/<ClassName>.java`` over HTTP every
minute (FilterClassManager.fetchClassFromRemoteHost,
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/filter/FilterClassManager.java);
Sluice reads a local directory, which the operator fills by whatever deployment
they trust.
"""
from __future__ import annotations

import zlib
from pathlib import Path

from sluice.errors import FilterClassNotFoundError
from sluice.filter.classfilter import parse_class_name

__all__ = ["ClassRepository", "class_crc", "MAX_SOURCE_BYTES"]

#: Largest class source accepted (repository file or upload).
MAX_SOURCE_BYTES = 1024 * 1024


def class_crc(source: bytes) -> int:
    """CRC32 of the source bytes, unsigned (UtilAll.crc32; 0 means "no source")."""
    return zlib.crc32(source) & 0xFFFFFFFF


class ClassRepository:
    def __init__(self, directory: str | Path | None) -> None:
        self.directory = Path(directory).resolve() if directory else None

    def path_of(self, class_name: str) -> Path | None:
        module, _ = parse_class_name(class_name)
        if self.directory is None:
            return None
        return self.directory.joinpath(*module.split(".")).with_suffix(".py")

    def load(self, class_name: str) -> bytes:
        """The module source that defines ``class_name``; FilterClassNotFoundError naming where it looked."""
        path = self.path_of(class_name)
        if path is None:
            raise FilterClassNotFoundError(
                f"filter class {class_name!r} not found: this filter server has no class repository "
                "(filter_class_repository) and uploads are off", class_name=class_name,
                cause="no class repository")
        try:
            source = path.read_bytes()
        except FileNotFoundError:
            raise FilterClassNotFoundError(f"filter class {class_name!r} not found in the class repository "
                                           f"({path} does not exist)", class_name=class_name,
                                           cause=f"{path} does not exist") from None
        except OSError as exc:
            raise FilterClassNotFoundError(f"filter class {class_name!r}: cannot read {path}: {exc}",
                                           class_name=class_name, cause=f"cannot read {path}: {exc}") from None
        if len(source) > MAX_SOURCE_BYTES:
            raise FilterClassNotFoundError(f"filter class {class_name!r}: {path} is {len(source)} bytes, more than "
                                           f"{MAX_SOURCE_BYTES}", class_name=class_name, cause="source too large")
        return source
