"""Where filter classes come from when uploads are off: what the operator keeps.

``module:ClassName`` is looked up as ``DIR/module.py`` (a dotted module as
``DIR/pkg/mod.py``) in the repository directory, and where that has no such file
(or there is no directory) as ``URL/module.py`` (``URL/pkg/mod.py``) under the
repository base URL, over HTTP(S) with a timeout. The filter server reads the
bytes and their CRC32; it never imports them itself (a worker does,
sluice/filtersrv/worker.py). RocketMQ fetched ``filterClassRepertoryUrl/<ClassName>.java``
every minute (FilterClassManager.fetchClassFromRemoteHost,
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/filter/FilterClassManager.java).
"""
from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from sluice.errors import FilterClassNotFoundError, InvalidParameterError
from sluice.filter.classfilter import parse_class_name

__all__ = ["ClassRepository", "class_crc", "crc_matches", "MAX_SOURCE_BYTES", "FETCH_TIMEOUT_S"]

#: Largest class source accepted (repository file, download or upload).
MAX_SOURCE_BYTES = 1024 * 1024
#: A download from the repository URL that takes longer fails (the registration says so).
FETCH_TIMEOUT_S = 5.0


def class_crc(source: bytes) -> int:
    """CRC32 of the source bytes, unsigned (0 means "no source")."""
    return zlib.crc32(source) & 0xFFFFFFFF


def crc_matches(crc: int, source: bytes) -> bool:
    """Whether a registration's classCRC (read as unsigned 32 bits) is ``source``'s: either the full CRC32 or,
    as RocketMQ's clients send it, masked to 31 bits (UtilAll.crc32,
    common/src/main/java/org/apache/rocketmq/common/UtilAll.java: ``crc32.getValue() & 0x7FFFFFFF``)."""
    full = class_crc(source)
    return (crc & 0xFFFFFFFF) in (full, full & 0x7FFFFFFF)


class ClassRepository:
    def __init__(self, directory: str | Path | None, url: str | None = None) -> None:
        self.directory = Path(directory).resolve() if directory else None
        if url and not url.startswith(("http://", "https://")):
            raise InvalidParameterError(f"the class repository URL {url!r} is not http:// or https://")
        self.url = url.rstrip("/") if url else None

    def path_of(self, class_name: str) -> Path | None:
        module, _ = parse_class_name(class_name)
        if self.directory is None:
            return None
        return self.directory.joinpath(*module.split(".")).with_suffix(".py")

    def url_of(self, class_name: str) -> str | None:
        module, _ = parse_class_name(class_name)
        return None if self.url is None else f"{self.url}/{'/'.join(module.split('.'))}.py"

    def _not_found(self, class_name: str, cause: str) -> FilterClassNotFoundError:
        return FilterClassNotFoundError(f"filter class {class_name!r} not found in the class repository: {cause}",
                                        class_name=class_name, cause=cause)

    async def load(self, class_name: str) -> bytes:
        """The module source that defines ``class_name``; FilterClassNotFoundError naming where it looked."""
        path, url = self.path_of(class_name), self.url_of(class_name)
        if path is None and url is None:
            raise FilterClassNotFoundError(
                f"filter class {class_name!r} not found: this filter server has no class repository "
                "(filter_class_repository) and uploads are off", class_name=class_name,
                cause="no class repository")
        looked: list[str] = []
        if path is not None:
            try:
                source = path.read_bytes()
            except FileNotFoundError:
                looked.append(f"{path} does not exist")
            except OSError as exc:
                raise self._not_found(class_name, f"cannot read {path}: {exc}") from None
            else:
                return self._checked(class_name, source, str(path))
        if url is not None:
            source = await asyncio.to_thread(self._fetch, class_name, url)
            if source is not None:
                return self._checked(class_name, source, url)
            looked.append(f"{url} answered 404")
        raise self._not_found(class_name, "; ".join(looked))

    def _fetch(self, class_name: str, url: str) -> bytes | None:
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 - http(s) only
                return resp.read(MAX_SOURCE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise self._not_found(class_name, f"{url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._not_found(class_name, f"cannot fetch {url}: {getattr(exc, 'reason', exc)}") from None

    def _checked(self, class_name: str, source: bytes, where: str) -> bytes:
        if len(source) > MAX_SOURCE_BYTES:
            raise self._not_found(class_name, f"{where} is more than {MAX_SOURCE_BYTES} bytes")
        return source
