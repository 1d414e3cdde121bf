"""Drives the Apache C++ 4.x client (librocketmq 1.0.1 inside the `rocketmq` 0.4.4 wheel).

Run it with .venv-cpp/bin/python (scripts/bootstrap_clients.sh creates that venv); it needs
nothing from sluice. Each run does one job and prints one JSON object per line: one per message
sent or received, then {"event": "summary", "ok": ...}. Exit status: 0 done, 1 the job failed
(send error, too few messages), 2 bad usage or nothing listening at --namesrv, 3 the watchdog
fired because the library hung.

    send  --messages JSON    sync-send each message ([{"tags", "keys": [...], "props": {...},
                             "body_b64"}]), or all in one batch with --batch
    push  --expression EXPR  push consumer (clustering); prints {"event": "ready"} once started
                             and settled, stops --linger seconds after --expect messages
    pull                     PullConsumer from offset 0 over every queue until no new message

librocketmq reads bodies as C strings, so a body it *receives* ends at its first NUL byte.
It writes its logs under $HOME/logs/rocketmq-cpp: tests point HOME at a temp dir.
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import socket
import sys
import threading
import time
from typing import Any, NoReturn

_out_lock = threading.Lock()


def emit(**fields: Any) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
        sys.stdout.flush()


def finish(code: int, **summary: Any) -> NoReturn:
    """Print the summary as the last line and exit at once."""
    line = json.dumps({"event": "summary", "ok": code == 0, **summary}, sort_keys=True)
    # Holding the lock until exit keeps callback threads from printing after the summary.
    # os._exit skips the wheel's __del__ hooks: they shut down and destroy the native clients a
    # second time, which librocketmq does not survive.
    _out_lock.acquire()
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    os._exit(code)


def start_watchdog(seconds: float) -> None:
    """librocketmq can block forever (e.g. in shutdown); never outlive the caller's budget."""
    def fire() -> None:
        emit(event="error", error=f"watchdog: still running after {seconds:.1f}s")
        finish(3, error="watchdog")
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


def check_namesrv(addr: str) -> None:
    """Fail fast and clearly when nothing listens, instead of waiting out the client's retries."""
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except (OSError, ValueError) as exc:
        finish(2, error=f"namesrv {addr} not reachable: {exc}")


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def describe(msg: Any, prop_names: list[str]) -> dict[str, Any]:
    """A RecvMessage as JSON. The C API cannot list properties, so only the named ones are read."""
    body = msg.body or b""
    props = {}
    for name in prop_names:
        value = _text(msg.get_property(name))
        if value:  # librocketmq answers "" for a missing property
            props[name] = value
    keys = _text(msg.keys) or ""
    return {
        "topic": msg.topic,
        "tags": _text(msg.tags),
        "keys": keys.split(),
        "properties": props,
        "uniq_key": _text(msg.get_property("UNIQ_KEY")),
        "body_b64": base64.b64encode(body).decode(),
        "msg_id": msg.id,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "reconsume_times": msg.reconsume_times,
    }


def build_message(topic: str, spec: dict[str, Any]) -> Any:
    from rocketmq.client import Message
    from rocketmq.ffi import dll

    msg = Message(topic)
    if spec.get("tags"):
        msg.set_tags(spec["tags"])
    if spec.get("keys"):
        msg.set_keys(" ".join(spec["keys"]))
    for key, value in (spec.get("props") or {}).items():
        msg.set_property(key, str(value))
    body = base64.b64decode(spec.get("body_b64", ""))
    # SetByteMessageBody takes a length, so bodies may hold NUL bytes (set_body would cut them).
    status = dll.SetByteMessageBody(msg._handle, body, len(body))
    if status != 0:
        raise RuntimeError(f"SetByteMessageBody failed with status {int(status)}")
    return msg


def cmd_send(args: argparse.Namespace, deadline: float) -> NoReturn:
    from rocketmq.client import Producer

    specs = load_messages(args.messages)
    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    producer.set_timeout(int(args.send_timeout * 1000))
    if args.access_key:  # sign every request (RocketMQ ACL)
        producer.set_session_credentials(args.access_key, args.secret_key, args.channel)
    producer.start()
    sent = 0
    error = None
    try:
        if args.batch:
            result = producer.send_batch([build_message(args.topic, s) for s in specs])
            emit(event="sent", index=0, count=len(specs), status=result.status.name,
                 msg_id=result.msg_id, offset=result.offset)
            sent = len(specs)
        else:
            for index, spec in enumerate(specs):
                if time.monotonic() > deadline:
                    error = f"deadline reached after {sent} of {len(specs)} sends"
                    break
                result = producer.send_sync(build_message(args.topic, spec))
                # The C API's send result carries no queue id: status, msg id and queue offset only.
                emit(event="sent", index=index, status=result.status.name,
                     msg_id=result.msg_id, offset=result.offset)
                sent += 1
                if result.status.name != "OK":
                    error = f"send {index} returned {result.status.name}"
                    break
    except Exception as exc:  # the wheel raises its own RocketMQException tree
        error = f"{type(exc).__name__}: {exc}"
        emit(event="error", error=error)
    producer.shutdown()
    finish(1 if error else 0, sent=sent, wanted=len(specs), error=error)


def cmd_push(args: argparse.Namespace, deadline: float) -> NoReturn:
    from rocketmq.client import PushConsumer

    prop_names = [p for p in args.props.split(",") if p]
    received = 0
    reached = threading.Event()
    count_lock = threading.Lock()

    def on_message(msg: Any) -> None:
        nonlocal received
        emit(event="message", **describe(msg, prop_names))
        with count_lock:
            received += 1
            if received >= args.expect:
                reached.set()

    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_thread_count(1)
    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    # Rebalance and the first offset query run in the background; a new librocketmq group starts
    # at the queue tail, so the caller must not send before the consumer owns its queues.
    time.sleep(args.settle)
    emit(event="ready")
    if args.expect > 0:
        reached.wait(max(0.0, deadline - time.monotonic()))
    if reached.is_set() or args.expect == 0:
        time.sleep(min(args.linger, max(0.0, deadline - time.monotonic())))
    consumer.shutdown()
    with count_lock:
        got = received
    error = None if got >= args.expect else f"received {got} of {args.expect} messages before the deadline"
    finish(1 if error else 0, received=got, expected=args.expect, error=error)


def cmd_pull(args: argparse.Namespace, deadline: float) -> NoReturn:
    from rocketmq.client import PullConsumer, RecvMessage
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import _CMessageQueue, _CPullStatus, dll

    prop_names = [p for p in args.props.split(",") if p]
    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    queues_ptr = ctypes.POINTER(_CMessageQueue)()
    count = ctypes.c_int()
    received = 0
    error = None
    queues: list[dict[str, Any]] = []
    try:
        ffi_check(dll.FetchSubscriptionMessageQueues(
            consumer._handle, args.topic.encode(), ctypes.pointer(queues_ptr), ctypes.pointer(count)))
        # The wheel's PullConsumer.pull loops forever on BROKER_TIMEOUT; this loop has a deadline.
        for i in range(count.value):
            mq = queues_ptr[i]
            offset, statuses = 0, []
            while time.monotonic() < deadline:
                res = dll.Pull(consumer._handle, ctypes.pointer(mq), args.expression.encode(),
                               offset, args.max_num)
                status = _CPullStatus(res.pullStatus)
                statuses.append(status.name)
                if status == _CPullStatus.FOUND:
                    for k in range(res.size):
                        emit(event="message", **describe(RecvMessage(res.msgFoundList[k]), prop_names))
                        received += 1
                progressed = res.nextBeginOffset > offset
                if status != _CPullStatus.BROKER_TIMEOUT:
                    offset = res.nextBeginOffset
                dll.ReleasePullResult(res)
                if status == _CPullStatus.NO_NEW_MSG:
                    break
                if status in (_CPullStatus.NO_MATCHED_MSG, _CPullStatus.OFFSET_ILLEGAL) and not progressed:
                    break
            else:
                error = f"deadline reached while pulling queue {mq.queueId}"
            queues.append({"queue_id": mq.queueId, "broker": _text(mq.brokerName),
                           "next_offset": offset, "statuses": statuses[-5:]})
            if error:
                break
        ffi_check(dll.ReleaseSubscriptionMessageQueue(queues_ptr))
        if count.value == 0:
            error = f"no message queues for topic {args.topic}"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        emit(event="error", error=error)
    consumer.shutdown()
    code = 1 if error or received < args.expect else 0
    if not error and received < args.expect:
        error = f"pulled {received} of {args.expect} messages"
    finish(code, received=received, queues=queues, error=error)


def load_messages(text: str) -> list[dict[str, Any]]:
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    specs = json.loads(text)
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise ValueError("--messages must be a JSON list of objects")
    return specs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("send", "push", "pull"):
        p = sub.add_parser(name)
        p.add_argument("--namesrv", required=True, help="host:port of the name server")
        p.add_argument("--topic", required=True)
        p.add_argument("--group", required=True, help="producer or consumer group")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole job")
        p.add_argument("--access-key", default="", help="ACL account (send only): set_session_credentials")
        p.add_argument("--secret-key", default="")
        p.add_argument("--channel", default="ALIYUN")
        if name == "send":
            p.add_argument("--messages", required=True, help="JSON list, or @file holding one")
            p.add_argument("--batch", action="store_true", help="one SendBatchMessage for all")
            p.add_argument("--send-timeout", type=float, default=5.0, help="seconds per send")
        else:
            p.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
            p.add_argument("--expect", type=int, default=0, help="messages wanted for success")
            p.add_argument("--props", default="", help="comma-separated property names to print")
        if name == "push":
            p.add_argument("--settle", type=float, default=3.0, help="seconds before 'ready'")
            p.add_argument("--linger", type=float, default=2.0,
                           help="seconds to keep listening after --expect, to catch extras")
        if name == "pull":
            p.add_argument("--max-num", type=int, default=32)
    return parser.parse_args(argv)


def main(argv: list[str]) -> NoReturn:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error
        os._exit(2 if exc.code else 0)
    deadline = time.monotonic() + args.timeout
    start_watchdog(args.timeout + 10.0)
    try:
        if args.command == "send":
            load_messages(args.messages)
    except (OSError, ValueError) as exc:
        finish(2, error=f"bad --messages: {exc}")
    check_namesrv(args.namesrv)
    try:
        {"send": cmd_send, "push": cmd_push, "pull": cmd_pull}[args.command](args, deadline)
    except Exception as exc:
        finish(1, error=f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
