"""A push consumer in its own process, for the guarantee tests (run by push_support.start_worker).

Each consumed message becomes one line in ``--log`` (written with one O_APPEND write before the listener
returns, so it survives SIGKILL):
``name  queue_id  queue_offset  msg_id  reconsume_times  start_ns  end_ns  body``.
Lines starting with ``#owned`` list the queues the consumer holds (every 0.2 s). SIGTERM shuts down cleanly.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time

from sluice import ConsumeOrderlyResult, ConsumeResult, PushConsumer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", default="CLUSTERING")
    ap.add_argument("--orderly", action="store_true")
    ap.add_argument("--from-where", default="CONSUME_FROM_LAST_OFFSET")
    ap.add_argument("--offset-dir", default="")
    ap.add_argument("--work-ms", type=float, default=0.0, help="time the listener spends per message")
    ap.add_argument("--persist-interval", type=float, default=5.0)
    args = ap.parse_args()

    fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def listener(msgs):  # type: ignore[no-untyped-def]
        start = time.time_ns()
        if args.work_ms:
            time.sleep(args.work_ms * len(msgs) / 1000)
        end = time.time_ns()
        out = "".join(f"{args.name}\t{m.queue_id}\t{m.queue_offset}\t{m.msg_id}\t{m.reconsume_times}\t{start}\t"
                      f"{end}\t{m.body.decode()}\n" for m in msgs)
        os.write(fd, out.encode())
        return ConsumeOrderlyResult.SUCCESS if args.orderly else ConsumeResult.SUCCESS

    options = {"message_model": args.model, "consume_from_where": args.from_where,
               "persist_offset_interval": args.persist_interval, "instance_name": args.name}
    if args.offset_dir:
        options["offset_store_dir"] = args.offset_dir
    consumer = PushConsumer(args.group, namesrv=args.namesrv, **options)
    consumer.subscribe(args.topic, "*")
    consumer.register_listener(listener, orderly=args.orderly)
    consumer.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        owned = ",".join(f"{q.topic}/{q.queue_id}" for q in consumer.owned_queues() if q.topic == args.topic)
        os.write(fd, f"#owned {time.time_ns()} {owned}\n".encode())
        stop.wait(0.2)
    consumer.shutdown()
    os.write(fd, b"#stopped\n")
    os.close(fd)


if __name__ == "__main__":
    main()
