"""Child process for the crash tests: append with synchronous flush, print each acknowledged message.

Usage: crash_writer.py STORE_DIR SEED
Each line is printed only after put_messages returned, i.e. after fsync:
    <commitlog offset> <topic> <queue id> <queue offset> <sha256 of body> <key>
The parent kills this process with SIGKILL at random moments.
"""
from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from store_testlib import acked_lines, small_config  # noqa: E402

from sluice.store import MessageStore, StoreMessage  # noqa: E402

CONFIG = dict(flush_mode="sync", commitlog_file_size=256 * 1024, consumequeue_units_per_file=50,
              index_max_hash_slots=64, index_max_index_num=300, checkpoint_interval_ms=50,
              max_message_size=16 * 1024)


def main() -> None:
    root, seed = Path(sys.argv[1]), int(sys.argv[2])
    store = MessageStore(root, small_config(**CONFIG)).start()
    out_lock = threading.Lock()
    print("ready", flush=True)

    def writer(wid: int) -> None:
        rnd = random.Random(seed * 1000 + wid)
        n = 0
        while True:
            topic = f"T{wid}"
            qid = rnd.randrange(2)
            batch = []
            for _ in range(rnd.choice((1, 1, 2, 5))):
                n += 1
                key = f"s{seed}w{wid}n{n}"
                body = rnd.randbytes(rnd.randrange(1, 3000))
                batch.append(StoreMessage(topic, body, qid, {"KEYS": key, "TAGS": f"tag{n % 3}"}))
            res = store.put_messages(batch)
            lines = acked_lines(res, batch)
            with out_lock:
                sys.stdout.write(lines)
                sys.stdout.flush()

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
