"""The worker subprocess that runs one filter class: ``python -m sluice.filtersrv.worker``.

A filter server never runs a filter class in its own process (RocketMQ's
FilterClassManager compiled and ran uploaded classes inside the filter server,
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/filter/FilterClassManager.java).
Each class runs here, under resource limits set before its code is loaded:
``RLIMIT_AS`` (address space, hard), and ``RLIMIT_CPU`` with the soft limit moved
to "used + cpu_seconds" before each batch (the kernel's SIGXCPU ends a batch that
spins) and a hard limit for the worker's life (SIGKILL past it; the server
replaces a worker before it gets near). The server adds a wall-clock deadline per
batch and kills a worker that misses it. The worker sees no store and no
socket it was given: only the records of one pulled batch at a time.

Frames on stdin (server -> worker): a 4-byte big-endian length, then the payload.
The first is a JSON object (class_name, cpu_seconds, cpu_lifetime_seconds,
memory_bytes, and ``batch_fd``/``batch_bytes`` when the server shares a memory file
for batches), the second the class's source; then one frame per batch: ``S`` and a
4-byte length, the batch being that many bytes at the start of the shared file
(written before the frame, read into the worker's own copy: the server keeps its
own and never reads the file back), or ``P`` and the batch itself (too big for the
file, or no file); a batch is the stored records back to back as a pull answers them; the class gets each as a lazy
MessageExt view (sluice/filtersrv/view.py).

Frames on the reply pipe (worker -> server): one kind byte, a 4-byte length, the
payload. ``R`` ready; ``I`` the class could not be loaded (text); ``M`` a batch's
answer (8-byte CPU seconds used so far, then one byte per record, 1 = keep); ``E``
the class raised on a batch (text). The reply pipe is the worker's original
stdout; ``sys.stdout`` is pointed at stderr so a class that prints cannot forge a
reply. Replies are plain bytes, never pickles: the server trusts nothing a worker
sends beyond their shape.
"""
from __future__ import annotations

import json
import os
import resource
import struct
import sys
import traceback
import types
from typing import Any, BinaryIO

from sluice.filtersrv.heap import keep_freed_heap

__all__ = ["main", "READY", "IMPORT_FAILED", "MASK", "RAISED"]

READY, IMPORT_FAILED, MASK, RAISED = b"R", b"I", b"M", b"E"
#: A batch frame's first byte: the batch is in the shared file (then its length), or follows in the pipe.
IN_SHARED, IN_PIPE = b"S", b"P"
_LEN = struct.Struct(">I")
_CPU = struct.Struct(">d")
#: Longest error text sent back (a traceback's last lines name the cause).
MAX_ERROR_TEXT = 2000


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(stream: BinaryIO) -> bytes | None:
    head = _read_exact(stream, 4)
    if head is None:
        return None
    return _read_exact(stream, _LEN.unpack(head)[0])


def _reply(out: BinaryIO, kind: bytes, payload: bytes = b"") -> None:
    out.write(kind + _LEN.pack(len(payload)) + payload)
    out.flush()


def _cpu_used() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _limit_cpu(seconds: float, hard: int) -> None:
    soft = min(hard, int(_cpu_used() + seconds) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "MemoryError: exceeded the worker's address-space limit"
    lines = traceback.format_exception_only(type(exc), exc)
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return ("".join(lines).strip() + where)[:MAX_ERROR_TEXT]


def load_class(class_name: str, source: bytes) -> Any:
    """Execute the module source as ``module`` and build ``ClassName()``; it must be a MessageFilter."""
    from sluice.filter.classfilter import MessageFilter, parse_class_name
    module_name, attr = parse_class_name(class_name)
    module = types.ModuleType(module_name)
    module.__file__ = f"<filter class {module_name}>"
    sys.modules[module_name] = module  # dataclasses and pickling look a class's module up by name
    code = compile(source, module.__file__, "exec")
    exec(code, module.__dict__)
    cls = getattr(module, attr, None)
    if cls is None:
        raise ImportError(f"module {module_name} defines no {attr}")
    if not (isinstance(cls, type) and issubclass(cls, MessageFilter)):
        raise TypeError(f"{class_name} is not a subclass of sluice.filter.MessageFilter")
    return cls()


def decode(body: bytes) -> list[Any]:
    """The batch's records as the lazy MessageExt views the class is handed (sluice/filtersrv/view.py)."""
    from sluice.filtersrv.view import views
    return views(body)


def filter_batch(match: Any, body: bytes) -> bytes:
    """One byte per record of ``body``, 1 where ``match`` kept it. In C where built
    (sluice._speedups.filter_views, this is its twin): each view made just before its call, so a batch
    holds one at a time rather than a list of them all (less memory, and no collector passes over them)."""
    from sluice.filtersrv.view import MessageView
    from sluice.speedups import C
    if C is not None:
        got = C.filter_views(body, MessageView, match)
        if got is not None:
            return got
    return bytes([1 if match(m) else 0 for m in decode(body)])


def _exit_with_parent() -> None:
    """A worker whose filter server died (SIGKILL leaves no one to close its pipe while a class hangs) ends."""
    import threading
    import time
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> int:
    _exit_with_parent()
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # what the class prints goes to stderr, never into the reply pipe
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    init = read_frame(stdin)
    source = read_frame(stdin)
    if init is None or source is None:
        return 2
    conf = json.loads(init)
    keep_freed_heap()  # a batch copied out of the shared file per batch (filtersrv/heap.py)
    shared = None
    if conf.get("batch_fd") is not None:  # mapped before the address-space limit is set
        import mmap
        shared = mmap.mmap(int(conf["batch_fd"]), int(conf["batch_bytes"]), prot=mmap.PROT_READ)
        os.close(int(conf["batch_fd"]))
    class_name = conf["class_name"]
    memory = int(conf.get("memory_bytes") or 0)
    cpu = float(conf["cpu_seconds"])
    hard = int(_cpu_used() + float(conf["cpu_lifetime_seconds"])) + 1
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _limit_cpu(cpu, hard)
    try:
        decode(b"")  # load the decoder before the class can use up memory
        filter_batch(None, b"")
        instance = load_class(class_name, source)
        match = instance.match
    except BaseException as exc:  # anything the class's module does on import is its failure
        _reply(out, IMPORT_FAILED, _error_text(exc).encode("utf-8", "replace"))
        return 1
    _reply(out, READY)
    while True:
        frame = read_frame(stdin)
        if frame is None:
            return 0
        _limit_cpu(cpu, hard)
        try:
            if frame[:1] == IN_SHARED and shared is not None:
                body = shared[:_LEN.unpack_from(frame, 1)[0]]  # a copy: the views outlive the next batch
            elif frame[:1] == IN_PIPE:
                body = frame[1:]
            else:
                raise ValueError(f"a batch frame of kind {frame[:1]!r}")
            keep = filter_batch(match, body)
        except BaseException as exc:
            _reply(out, RAISED, _error_text(exc).encode("utf-8", "replace"))
            return 1
        _reply(out, MASK, _CPU.pack(_cpu_used()) + keep)


if __name__ == "__main__":
    sys.exit(main())
