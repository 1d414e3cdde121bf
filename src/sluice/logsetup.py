"""Where the servers' logs go: stderr always, and with a log directory a size-rotated file too.

RocketMQ's servers log to rotating files under ``~/logs/rocketmqlogs`` (logback,
1 GiB per file); Sluice keeps stderr (what a supervisor captures) and adds a
``<name>.log`` in ``--log-dir`` that rotates at ``max_bytes`` and keeps
``backups`` old files (``<name>.log.1`` is the newest of those).
"""
from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

from sluice.errors import InvalidParameterError

__all__ = ["LEVELS", "FORMAT", "DEFAULT_MAX_BYTES", "DEFAULT_BACKUPS", "check_level", "configure_logging"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: A day of a busy broker's INFO lines fits; ten of them bound the directory to well under a GiB.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BACKUPS = 10


def check_level(level: str) -> str:
    """``level`` upper-cased, or an error naming the levels there are."""
    up = str(level).upper()
    if up not in LEVELS:
        raise InvalidParameterError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    return up


def configure_logging(level: str, *, name: str, log_dir: str | Path | None = None,
                      max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> Path | None:
    """Set the root logger: ``level``, stderr, and ``log_dir/<name>.log`` rotated when given.

    Returns the log file's path (None without ``log_dir``). A directory that cannot be made or written,
    or a non-positive size, is an InvalidParameterError saying so: the server should not start blind."""
    level = check_level(level)
    if max_bytes < 1 or backups < 0:
        raise InvalidParameterError(f"log file size {max_bytes} must be positive and backups {backups} not negative")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    path: Path | None = None
    if log_dir:
        path = Path(log_dir) / f"{name}.log"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handlers.append(logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups,
                                                                 encoding="utf-8"))
        except OSError as exc:
            raise InvalidParameterError(f"cannot write logs in {log_dir}: {exc}") from None
    logging.basicConfig(level=level, format=FORMAT, handlers=handlers, force=True)
    return path
