"""Child process of test_crash_points.py: a store's life that ends right after its K-th file-system call.

Usage: crash_points_child.py STORE_DIR K

The store (synchronous flush, small files, so segments, consume-queue files and the key index are created
and rolled within a few dozen puts) is opened, written, checkpointed, closed, opened again and written
again, by one thread. Every call of ``os`` that changes files (a create, a size change, an allocation, a
sync, a rename or removal, a write through a descriptor) is counted; the K-th is made and then the process
ends at once with ``os._exit(9)``, as a SIGKILL there would end it: bytes written into mappings so far stay
in the page cache, as they do after a kill. With K = 0 nothing crashes and the last line is ``calls N``.

Each put's messages are printed once ``put_messages`` returned (durable: synchronous flush), as
crash_writer.py prints them (``store_testlib.acked_lines``).
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from store_testlib import acked_lines, small_config  # noqa: E402

from sluice.store import MessageStore, StoreMessage  # noqa: E402

#: Small files: a 96 KiB commit-log segment holds about 60 of these messages, a consume-queue file 20 units.
#: The index file is larger than what its creation allocates at once (header, slots and the first MiB of
#: entries), as at the default sizes: creation then has a window between allocating and sizing it.
CONFIG = dict(flush_mode="sync", commitlog_file_size=96 * 1024, consumequeue_units_per_file=20,
              index_max_hash_slots=64, index_max_index_num=60_000, checkpoint_interval_ms=3_600_000,
              flush_interval_ms=3_600_000, max_message_size=8 * 1024)

_CHANGING = ("ftruncate", "truncate", "posix_fallocate", "fdatasync", "fsync", "rename", "replace", "unlink",
             "rmdir", "pwrite", "pwritev", "write", "writev")

calls = 0


def _install(crash_at: int) -> None:
    real_write = os.write

    def counted(name: str, real):
        def call(*args, **kw):
            global calls
            result = real(*args, **kw)
            calls += 1
            if calls == crash_at:  # say where, for the parent's failure message
                real_write(2, f"crashed after {name}{tuple(map(str, args))[:2]}\n".encode())
                os._exit(9)
            return result
        call.__name__ = name
        return call

    real_open = os.open

    def open_(path, flags, *args, **kw):  # only a create changes the directory
        return (open_created if flags & os.O_CREAT else real_open)(path, flags, *args, **kw)
    open_created = counted("open", real_open)
    for name in _CHANGING:
        if hasattr(os, name):
            setattr(os, name, counted(name, getattr(os, name)))
    os.open = open_


def _life(root: Path, rnd: random.Random, puts: int, tag: str) -> None:
    store = MessageStore(root, small_config(**CONFIG)).start()
    for i in range(puts):
        topic, qid = f"T{i % 2}", rnd.randrange(2)
        batch = [StoreMessage(topic, rnd.randbytes(rnd.randrange(200, 2500)), qid,
                              {"KEYS": f"{tag}-{i}-{j}", "TAGS": f"tag{j % 3}"}) for j in range(rnd.choice((1, 2, 3)))]
        res = store.put_messages(batch)
        sys.stdout.write(acked_lines(res, batch))
        sys.stdout.flush()
        if i % 15 == 14:
            store._checkpoint()  # what the maintenance thread does every checkpoint_interval_ms
    store.close()


def main() -> None:
    root, crash_at = Path(sys.argv[1]), int(sys.argv[2])
    _install(crash_at)
    rnd = random.Random(7)
    _life(root, rnd, 45, "a")
    _life(root, rnd, 10, "b")  # a restart: recovery, and the files it reopens
    print(f"calls {calls}", flush=True)


if __name__ == "__main__":
    main()
