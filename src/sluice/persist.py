"""Files replaced whole, durably: the one atomic-write helper, and small JSON documents built on it.

:func:`write_atomic` writes a temp file in the target's directory, fsyncs it, renames it over the target
and fsyncs the directory, so a crash leaves either the old content or the new, never a mix, and the
rename itself survives a power loss. Used for the store's checkpoint and layout file, the broker's
JSON documents (topic configs, offsets, filter data) and backfill bitmaps, and the Spark jobs' files.
A bottom-layer module: it imports nothing from sluice.
"""
from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

import orjson

__all__ = ["fsync_dir", "read_json", "write_atomic", "write_json_atomic"]

log = logging.getLogger(__name__)

_serial = itertools.count()  # with the pid, a temp name no other writer of the same file uses


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (a rename, a new or removed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, write, flush, fsync, os.replace,
    then fsync the directory. On any failure the temp file is removed and ``path`` is left as it was."""
    path = Path(path)
    # Hidden, and unique per process and call: concurrent writers of one path never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_serial)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as indented JSON (write_atomic), creating its directory if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def read_json(path: Path, default: Any = None) -> Any:
    """Read a document written by write_json_atomic; a missing file gives ``default``.

    A damaged file is moved aside (``.bad``) and reported, so the broker starts
    with what it can trust instead of refusing to start.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        log.error("%s is not valid JSON (%s); moved to %s and starting without it", path, e, bad)
        return default
