"""Small durable JSON documents (topic configs, offsets, filter data): temp file + fsync + rename."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new document, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
