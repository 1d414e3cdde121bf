"""A small, size-limited filesystem for disk-full tests: tmpfs mounted (and unmounted) by the test.

Mounting needs root (CAP_SYS_ADMIN); where the machine cannot mount one the test is skipped with the
precise reason (the mount command's error), never silently passed.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(directory: Path, size: str = "64m") -> Iterator[Path]:
    """Mount a tmpfs of ``size`` on ``directory`` (created); unmounted on exit, lazily if still busy."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {size} tmpfs needs root (euid {os.geteuid()})")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs on {directory}: {r.stderr.strip() or r.returncode}")
    try:
        yield directory
    finally:
        if subprocess.run(["umount", str(directory)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill(directory: Path, leave: int) -> Path:
    """Fill the filesystem of ``directory`` with one allocated file until at most ``leave`` bytes stay
    free (1 MiB steps, then pages, each stopping at ENOSPC)."""
    path = directory / "filler"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        for step in (1 << 20, 4096):
            while True:
                st = os.statvfs(directory)
                if st.f_bavail * st.f_frsize - step < leave:
                    break
                try:
                    os.posix_fallocate(fd, size, step)
                except OSError:
                    break
                size += step
    finally:
        os.close(fd)
    return path
